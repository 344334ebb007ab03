"""Which analysed matrix is the model's head (its classifier or LM head), and how that was found.

The steps (option, framework, config, name, structure; the first that answers wins and is recorded as ``head_source``)
and the shape rule behind "structure" are described in docs/checkpoints.md (The head)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from wbfe.engine.experts import config_value
from wbfe.errors import InvalidOptionError, name_hint
from wbfe.framework import OUT_IN, FrameworkDescription, out_in
from wbfe.framework.transformers_model import LABEL_TASKS
from wbfe.sources import natural_key

__all__ = ["HeadChoice", "HEAD_NAMES", "UNSELECTED", "choose_head", "find_head", "head_rank", "terminal_matrices"]

UNSELECTED = "not selected by --layers"
"""The skip reason of a tensor ``--layers`` leaves out: a choice of the caller's, not a fault of the matrix."""

# Module names that hold a classifier / LM head, in order of preference (docs/math.md §2): LM heads,
# then the names classifiers are given in the model libraries and in the wild.
HEAD_NAMES = (
    ("lm_head", "embed_out"),
    ("classifier", "head", "fc", "linear", "logits", "output_layer", "score", "output", "predictions",
     "final_fc", "output_probs", "new_head", "conv_preds"),
)
# `architectures` suffixes of Hugging Face models whose head maps to the vocabulary, and to classes.
_LM_TASKS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "ForMaskedLM", "WithLMHead",
             "ForPreTraining", "ForSpeechSeq2Seq", "ForImageTextToText", "ForVision2Seq", "ForTextToSpeech")
_CLASS_TASKS = ("ForSequenceClassification", "ForImageClassification", "ForTokenClassification",
                "ForAudioClassification", "ForAudioFrameClassification", "ForMultipleChoice",
                "ForQuestionAnswering", "ForVideoClassification", "ForAudioXVector")
# Roles whose output feeds no matrix directly although they are no head: an embedding is looked up,
# attention projections go through the attention product first, a router's scores pick experts.
_NOT_HEADS = ("embedding", "attention", "router")
_TIED = re.compile(r"^tied: (?:shares storage with|identical to) (?P<name>.+)$")
# Skipped rows that are no weight matrix of the model's: the parts a quantised or composed weight consumed (the
# weight is its row), a graph's constants that feed no weight input (ONNX, TFLite), and another state dict's or an
# optimizer's tensors beside the one scored (wbfe.sources.torch_pickle).
_NOT_THE_MODELS = re.compile(r"^(?:consumed: |not a weight input|in '.*', (?:not|beside) the state dict scored|"
                             r"optimizer state \(in )")
_KERAS_SUFFIX = re.compile(r"[/.](kernel|weight)(:\d+)?$")


@dataclass(frozen=True)
class HeadChoice:
    """The head (None if none was found), the step that found it, and a note where there is doubt."""

    name: Optional[str]
    source: Optional[str]
    note: Optional[str] = None


def head_rank(name: str) -> Optional[int]:
    """Preference of ``name`` as a head by its module name (0 best), None if its name is no head's."""
    parts = [p for p in re.split(r"[./]", _KERAS_SUFFIX.sub("", name)) if p and not p.isdigit()]
    return next((rank for rank, names in enumerate(HEAD_NAMES) if parts and parts[-1] in names), None)


def find_head(names: Sequence[str], override: Optional[str] = None) -> Optional[str]:
    """Name of the classifier / LM-head matrix among analysed ``names``, by name alone (:data:`HEAD_NAMES`).

    ``override`` (a tensor name, or a module name without ``.weight``) wins, InvalidOptionError if it names no analysed
    matrix; among several of the best rank, the last in natural order; None if none match."""
    if override is not None:
        return _override(names, override)
    ranked = [(-rank, natural_key(name), name) for name in names if (rank := head_rank(name)) is not None]
    return max(ranked, key=lambda item: item[:2])[2] if ranked else None


def _named(names: Sequence[str], name: str) -> Optional[str]:
    return next((candidate for candidate in (name, f"{name}.weight") if candidate in names), None)


def _override(names: Sequence[str], override: str) -> str:
    if (found := _named(names, override)) is not None:
        return found
    raise InvalidOptionError(f"--head {override!r} is not an analysed matrix{name_hint(override, names)}")


def terminal_matrices(matrices: Iterable[tuple[Any, ...]], exclude: tuple[str, ...] = _NOT_HEADS) -> list[str]:
    """Names, in the given order, of the matrices whose output no other matrix reads (docs/checkpoints.md).

    ``matrices``: ``(name, shape, role)`` or ``(name, shape, role, layout)`` (``out_in`` by default). Matrices of the
    ``exclude`` roles are never heads (embeddings, attention projections and routers)."""
    listed = [(item[0], tuple(item[1]), item[2], item[3] if len(item) > 3 else OUT_IN)
              for item in matrices if len(item[1]) >= 2]
    # Who reads each width: a checkpoint is feed-forward, so a square matrix is no reader of its own
    # output (a lone 12 x 12 classifier is still terminal).
    dense_inputs: dict[int, set[str]] = {}
    conv_inputs: dict[int, set[str]] = {}
    for name, shape, role, layout in listed:
        out, inp = out_in(shape, layout)
        if role == "embedding":  # looked up, or (a patch embedding) reads pixels
            continue
        (dense_inputs if len(shape) == 2 else conv_inputs).setdefault(inp, set()).add(name)
        if any(k > 1 for k in shape[2:]) and inp < out and out % inp == 0:  # no kernel sizes: dense
            conv_inputs.setdefault(out, set()).add(name)

    def read(name: str, shape: tuple[int, ...], layout: str) -> bool:
        out = out_in(shape, layout)[0]
        readers = dense_inputs.get(out, set()) | (conv_inputs.get(out, set()) if len(shape) > 2 else set())
        return bool(readers - {name})

    return [name for name, shape, role, layout in listed if role not in exclude and not read(name, shape, layout)]


def choose_head(
    layers: Sequence[dict[str, Any]], skipped: Sequence[dict[str, Any]] = (), *, override: Optional[str] = None,
    hint: Optional[str] = None, config: Optional[dict[str, Any]] = None,
    description: Optional[FrameworkDescription] = None,
) -> HeadChoice:
    """The head among the analysed ``layers`` (rows with ``name``, ``shape``, ``role``, in the checkpoint's order),
    using the ``skipped`` rows to see ties (docs/checkpoints.md, The head). ``hint`` is the head a reader names without
    a full description (ONNX's graph output); the ``description``'s head wins over every rule, and its layouts say each
    matrix's output dimension. Raises InvalidOptionError when ``override`` (the user's ``--head``) names no analysed
    matrix."""
    names = [layer["name"] for layer in layers]
    if override is not None:
        return HeadChoice(_override(names, override), "option")
    why = None
    if description is not None:
        layers = [dict(layer, layout=layer["layout"] if isinstance(layer.get("layout"), str)
                       else description.layout_of(layer["name"])) for layer in layers]
        if (chosen := _from_description(names, skipped, description)) is not None:
            return chosen
        why = f"{description.framework}: {description.note}" if description.note else None  # beside the rules' head
    if hint is not None and hint in names:
        chosen = HeadChoice(hint, "config")
    else:  # steps 3 to 5: the config rules, names, structure
        rows, held, ties = _with_held(layers, skipped)
        chosen = ((_from_config(layers, config) if config else None) or _by_name(names, rows, held, ties)
                  or _by_structure(rows, held))
    if why and chosen.note is None:
        chosen = HeadChoice(chosen.name, chosen.source, why)
    return chosen


def _from_description(original: Sequence[str], skipped: Sequence[dict[str, Any]],
                      description: FrameworkDescription) -> Optional[HeadChoice]:
    """The head the checkpoint's description names, where it is analysed (itself or, tied, the
    weight it is stored as); None to let the rules decide."""
    head, where = description.head, f"{description.framework} {description.model}"
    # Each analysed matrix by the description's name for it (a weight saved under its in-memory name).
    stored = {description.resolve(n): n for n in original}
    if head is None:
        # transformers knows when a model has no head (a base model): no rule should invent one.
        if description.framework == "transformers" and description.note:
            return HeadChoice(None, None, f"{where}: {description.note}")
        return None
    if head in stored:
        return HeadChoice(stored[head], "framework", description.note)
    ties = {description.resolve(s["name"]): description.resolve(m.group("name"))
            for s in skipped if (m := _TIED.match(str(s.get("reason", ""))))}
    target = description.tied.get(head) or ties.get(head)
    if target is not None and target in stored:
        return HeadChoice(stored[target], "framework", f"{head} is tied to {stored[target]} ({where})")
    reason = next((str(s.get("reason")) for s in skipped if description.resolve(s.get("name", "")) == head), None)
    if reason is not None and reason.startswith("all-zero"):  # untrained or zeroed: still the head, none other is
        return HeadChoice(None, None, f"{where}: the head {head} is an all-zero matrix (an untrained or zeroed "
                                      "classifier), so no head is scored")
    if reason is not None:
        return HeadChoice(None, None, f"{where}: the head {head} is not analysed ({reason}); pass --head NAME")
    return None  # stored under another name: the rules look for it


def _from_config(layers: Sequence[dict[str, Any]], config: dict[str, Any]) -> Optional[HeadChoice]:
    pretrained = config.get("pretrained_cfg")
    classifier = pretrained.get("classifier") if isinstance(pretrained, dict) else None
    if isinstance(classifier, str) and (named := _named([layer["name"] for layer in layers], classifier)):
        return HeadChoice(named, "config")
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures and isinstance(architectures[0], str) else None
    if arch is None:
        return None
    if arch.endswith(_CLASS_TASKS):
        labels = config.get("id2label")
        n = next((k for suffix, k in LABEL_TASKS.items() if arch.endswith(suffix)),  # QA: start and end
                 len(labels) if isinstance(labels, dict) and labels else config.get("num_labels", 2))
        if (found := _last_with_rows(layers, n, f"{arch} with {n} labels")).name is None:
            return HeadChoice(None, None, f"config: {arch}'s head has {n} output row(s), but no analysed matrix "
                                          "has that many; pass --head NAME")
        return found
    if arch.endswith(_LM_TASKS):
        vocab = config_value(config, "vocab_size")
        if not isinstance(vocab, int):
            return None
        tied = config_value(config, "tie_word_embeddings")
        embeddings = [layer["name"] for layer in layers if layer.get("role") == "embedding"
                      and len(layer["shape"]) == 2 and layer["shape"][0] == vocab]
        # Tied: the model's head *is* its input embedding (a separate copy stored is overwritten on load).
        if tied is True and embeddings:
            return HeadChoice(embeddings[0], "tied", "the LM head is tied to the input embedding (tie_word_embeddings)")
        if (found := _last_with_rows(layers, vocab, f"{arch}'s vocabulary of {vocab}")).name is not None:
            return found
        if tied is False:
            return HeadChoice(None, None, f"config: {arch} with untied embeddings, but no matrix of "
                                          f"{vocab} output rows was analysed; pass --head NAME")
        if embeddings:  # no LM head stored, and the config does not say: tied by transformers' default
            return HeadChoice(embeddings[0], "tied", "no LM head stored: it is tied to the input embedding")
        return None
    if arch.endswith("Model"):
        return HeadChoice(None, None, f"config: {arch} is a base model without a head; pass --head NAME")
    return None


def _terminal_rows(layers: Sequence[dict[str, Any]], exclude: tuple[str, ...] = _NOT_HEADS) -> list[str]:
    return terminal_matrices(((layer["name"], layer["shape"], layer.get("role", ""), layer.get("layout", OUT_IN))
                              for layer in layers), exclude)


def _last_with_rows(layers: Sequence[dict[str, Any]], rows: Any, what: str) -> HeadChoice:
    # A matrix whose output another reads only has the head's size by chance (GPT-2's MLP is 4 x 768 wide,
    # Falcon's 4 x hidden: a vocabulary that size in a tiny model).
    terminal = set(_terminal_rows(layers, exclude=()))
    found = [layer["name"] for layer in layers if layer.get("role") not in ("embedding", "router")
             and out_in(layer["shape"], layer.get("layout", OUT_IN))[0] == rows and layer["name"] in terminal]
    if not found:
        return HeadChoice(None, None)
    return HeadChoice(found[-1], "config", None if len(found) == 1 else
                      f"{len(found)} matrices map to {what} ({', '.join(found[-3:])}); the last is taken")


def _with_held(layers: Sequence[dict[str, Any]],
               skipped: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, str]]:
    """The rows with the matrices skipped for what they hold (all zero, non-finite, a quantisation not read), those
    by name with their reasons, and the tied copies by name with what they are tied to. A held matrix is still the
    model's, in its place in the structure: no other matrix stands in for it as the head."""
    ties = {s["name"]: m.group("name") for s in skipped if (m := _TIED.match(str(s.get("reason", ""))))}
    held = {s["name"]: str(s.get("reason")) for s in skipped if len(s.get("shape") or ()) >= 2
            and s["name"] not in ties and s.get("reason") != UNSELECTED and not _NOT_THE_MODELS.match(str(s["reason"]))}
    return [*layers, *({"name": s["name"], "shape": s["shape"], "role": ""} for s in skipped if s["name"] in held)], held, ties


def _by_name(names: list[str], rows: list[dict[str, Any]], held: dict[str, str],
             ties: dict[str, str]) -> Optional[HeadChoice]:
    terminal = set(_terminal_rows(rows))
    # A named head whose output another matrix reads is not the model's output layer.
    candidates = [n for n in [*names, *held] if n in terminal] + [t for t in ties if ties[t] in names]
    if (best := find_head(candidates)) is None:
        return None
    if best in ties:
        return HeadChoice(ties[best], "tied", f"{best} is tied to {ties[best]}")
    if best in held:
        return HeadChoice(None, None, f"the head, {best}, is skipped ({held[best]}); pass --head NAME to take another "
                                      "matrix")
    return HeadChoice(best, "name")


def _by_structure(rows: list[dict[str, Any]], held: dict[str, str]) -> HeadChoice:
    terminal = _terminal_rows(rows)
    # The skipped rows' place in the checkpoint's order among the analysed ones is not known: any of them that
    # feeds no other matrix may be the head
    if ends := [f"{name} ({held[name]})" for name in terminal if name in held]:
        return HeadChoice(None, None, f"no other matrix reads the output of {', '.join(ends)}, which is skipped: the "
                                      "head by structure is not scored; pass --head NAME to take another matrix")
    if not terminal:
        return HeadChoice(None, None, "no head found by config, name or structure; pass --head NAME")
    note = (f"{len(terminal)} matrices feed no other ({', '.join(terminal[:-1][-3:])}, {terminal[-1]}); "
            "the last in the checkpoint's order is taken") if len(terminal) > 1 else None
    return HeadChoice(terminal[-1], "structure", note)

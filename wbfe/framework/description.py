"""What a checkpoint's own framework says about it, as plain data: the model's order of weights,
its head, its tied weights and how each weight is laid out.

Readers fill a :class:`FrameworkDescription` from the checkpoint's own description (a transformers
or timm model class built on the meta device, a Keras ``model_config``, a GGUF file's tensor list);
the matrix planner and the head finder read it instead of guessing from names and shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Sequence

from wbfe.errors import InvalidOptionError

__all__ = ["Fallback", "Layout", "OUT_IN", "IN_OUT", "LAYOUTS", "FrameworkDescription", "out_in", "order_rows", "check_layout"]

# How a stored weight's axes are laid out. ``out_in``: [out, in, k...], PyTorch's nn.Linear and
# nn.Conv (and what the Keras and GGUF readers convert to). ``in_out``: [in, out, k...], stored
# transposed: transformers' Conv1D (GPT-2), PyTorch's ConvTranspose, Keras' Conv*Transpose.
Layout = Literal["out_in", "in_out"]
OUT_IN: Layout = "out_in"
IN_OUT: Layout = "in_out"
LAYOUTS: tuple[str, ...] = (OUT_IN, IN_OUT)


class Fallback(str):
    """Why a framework gave no description (wbfe's rules decide instead): a one-line reason."""


def check_layout(layout: str) -> str:
    """``layout`` itself if it is one of :data:`LAYOUTS`.

    Raises:
        InvalidOptionError: any other value.
    """
    if layout not in LAYOUTS:
        raise InvalidOptionError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return layout


def out_in(shape: Sequence[int], layout: str = OUT_IN) -> tuple[int, int]:
    """``(output, input)`` dimension of a weight of ``shape`` stored in ``layout``.

    Example:
        >>> out_in((3072, 768)), out_in((768, 3072), "in_out")
        ((3072, 768), (3072, 768))
    """
    if layout == IN_OUT:
        return int(shape[1]), int(shape[0])
    return int(shape[0]), int(shape[1])


@dataclass(frozen=True)
class FrameworkDescription:
    """A checkpoint as its own framework describes it.

    Attributes:
        framework: ``transformers``, ``timm``, ``keras`` or ``gguf``.
        model: the model's class or architecture (``GPT2LMHeadModel``, ``resnet18``, ``Functional``...).
        order: the weights' names in the model's order (``named_parameters()``, the layer graph, the file).
        head: the stored name of the head's weight (LM head or classifier); None when the framework
            says the model has none (a base model) or could not tell (see ``note``).
        tied: a weight that is the same parameter as an earlier one -> that earlier weight's name
            (transformers' tied LM head: ``lm_head.weight`` -> ``model.embed_tokens.weight``).
        layouts: the weights whose layout is not :data:`OUT_IN`, with theirs.
        note: why the head is None, or what else the user should know.
        aliases: another name a weight may be stored under -> its name here (transformers 5 keeps
            a model's names in memory but saves some models under their original checkpoint's,
            GPT-NeoX's ``lm_head.weight`` as ``embed_out.weight``: the description holds the saved
            names, and the in-memory ones are aliases).
        facts: what the description says about the path into the head, as plain data (read by
            :mod:`wbfe.framework.applicability`): ``family`` (transformers' ``model_type``, timm's
            architecture), ``dropout`` (``[[layer, rate], ...]``: dropout with rate > 0 on the
            features the head reads), ``heads`` (other layers producing the same output),
            ``head_class`` (the head layer's class, where the graph names it).
        roles: the weights whose role the model's own classes say (``router``: a MoE router or
            gating module, GraniteMoE's ``block_sparse_moe.router.layer.weight``; ``expert``: a
            module of experts); the name rules decide the others.
    """

    framework: str
    model: str
    order: tuple[str, ...] = ()
    head: Optional[str] = None
    tied: Mapping[str, str] = field(default_factory=dict)
    layouts: Mapping[str, str] = field(default_factory=dict)
    note: Optional[str] = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)
    roles: Mapping[str, str] = field(default_factory=dict)

    def resolve(self, name: str) -> str:
        """``name`` as this description names the weight (through :attr:`aliases`)."""
        return self.aliases.get(name, name)

    def layout_of(self, name: str) -> str:
        """The layout of weight ``name`` (:data:`OUT_IN` unless the framework says otherwise)."""
        return self.layouts.get(self.resolve(name), OUT_IN)

    def role_of(self, name: str) -> Optional[str]:
        """The role the model's classes give weight ``name`` (a split expert ``w[e]`` as ``w``); None
        where they say nothing."""
        if not self.roles:
            return None
        name = self.resolve(name)
        return self.roles.get(name) or self.roles.get(self.resolve(_EXPERT_SUFFIX.sub("", name)))

    def summary(self) -> dict[str, Any]:
        """What the result's provenance records about the description used."""
        out: dict[str, Any] = {"used": self.framework, "model": self.model}
        if self.note:
            out["note"] = self.note
        if self.facts.get("dropout_read"):  # how the dropout on the head's input was read (applicability)
            out["dropout_read"] = self.facts["dropout_read"]
        return out

    def to_dict(self) -> dict[str, Any]:
        """The description as JSON data (lists and string-keyed objects); :meth:`from_dict` reads it back."""
        return {"framework": self.framework, "model": self.model, "order": list(self.order), "head": self.head,
                "tied": dict(self.tied), "layouts": dict(self.layouts), "note": self.note,
                "aliases": dict(self.aliases), "facts": dict(self.facts), "roles": dict(self.roles)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FrameworkDescription":
        """The description :meth:`to_dict` gave ``data`` for.

        Raises:
            InvalidOptionError: ``data`` is not that shape (a missing or mistyped field, an unknown layout).
        """

        def names(key: str) -> dict[str, str]:
            value = data.get(key, {})
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in value.items()):
                raise InvalidOptionError(f"a framework description's {key} must map names to names")
            return dict(value)

        framework, model, order = data.get("framework"), data.get("model"), data.get("order", [])
        head, note, facts = data.get("head"), data.get("note"), data.get("facts", {})
        if not (isinstance(framework, str) and isinstance(model, str) and isinstance(order, list)
                and all(isinstance(n, str) for n in order) and isinstance(facts, Mapping)
                and (head is None or isinstance(head, str)) and (note is None or isinstance(note, str))):
            raise InvalidOptionError("not a framework description (framework, model, order, head, note, facts)")
        layouts = names("layouts")
        for layout in layouts.values():
            check_layout(layout)
        return cls(framework, model, tuple(order), head, names("tied"), layouts, note, aliases=names("aliases"),
                   facts=dict(facts), roles=names("roles"))


# A fused expert stack split per expert by wbfe.engine.experts is named ``<weight>[e]`` or ``<weight>[e].gate``.
_EXPERT_SUFFIX = re.compile(r"\[.*$")


def order_rows(rows: Sequence[dict[str, Any]], order: Optional[Sequence[str]],
               aliases: Optional[Mapping[str, str]] = None) -> list[dict[str, Any]]:
    """``rows`` (dicts with a ``name``) in the model's ``order``; the stored order where there is none.

    A row whose name the order lists goes to that place. Any other row (a weight stored under a name
    the model does not use, a per-expert copy of a fused stack) goes with the listed weight that
    shares the longest module path with it, after it; rows that land together keep their
    stored order. With no order (None or empty), the rows are returned as they came. ``aliases``:
    another name a weight may be stored under -> its name in ``order``.

    Example:
        >>> rows = [{"name": n} for n in ("lm_head.weight", "h.10.w", "h.2.w", "embed.weight")]
        >>> [r["name"] for r in order_rows(rows, ["embed.weight", "h.2.w", "h.10.w", "lm_head.weight"])]
        ['embed.weight', 'h.2.w', 'h.10.w', 'lm_head.weight']
    """
    if not order:
        return list(rows)
    position = {name: i for i, name in enumerate(order)}
    # Each module path prefix -> the last listed weight under it: where an unlisted weight goes.
    prefixes: dict[str, int] = {}
    for i, name in enumerate(order):
        parts = name.split(".")
        for k in range(1, len(parts)):
            prefixes[".".join(parts[:k])] = i

    def key(k: int, name: str) -> tuple[int, int, int]:
        name = (aliases or {}).get(name, name)
        if name in position:
            return position[name], 0, k
        stem = _EXPERT_SUFFIX.sub("", name)
        if stem in position:
            return position[stem], 1, k
        parts = stem.split(".")
        for n in range(len(parts) - 1, 0, -1):
            found = prefixes.get(".".join(parts[:n]))
            if found is not None:
                return found, 1, k
        return len(order), 1, k  # shares nothing with the model: after it, in stored order

    keyed = sorted(((key(k, str(row.get("name", ""))), k) for k, row in enumerate(rows)))
    return [rows[k] for _, k in keyed]

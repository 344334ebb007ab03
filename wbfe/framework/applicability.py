"""Whether BFE-W applies: the BFE-W paper's conditions (arXiv 2610.13123) checked against the
checkpoint's own description of its model, never a score (docs/metrics.md, "Where BFE-W applies")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from wbfe.framework.description import FrameworkDescription

__all__ = ["STATUSES", "Rule", "RULES", "VISION_TRANSFORMERS", "TIMM_VISION_TRANSFORMERS", "TORCH_VISION_TRANSFORMERS",
           "applicability"]

STATUSES = ("holds", "fails", "unknown")

# transformers ``model_type``s of vision transformers (patch embeddings + attention blocks, a head on a token).
VISION_TRANSFORMERS = frozenset({
    "vit", "vit_msn", "vit_mae", "vit_hybrid", "deit", "beit", "data2vec-vision", "dinov2",
    "dinov2_with_registers", "swin", "swinv2", "donut-swin", "levit", "pvt", "pvt_v2", "dit", "yolos",
    "vitdet", "hiera", "ijepa", "efficientformer", "mobilevit", "mobilevitv2", "cvt", "clip_vision_model",
    "siglip_vision_model", "segformer", "vivit", "timesformer", "videomae",
})
# timm architecture name prefixes of vision transformers.
TIMM_VISION_TRANSFORMERS = (
    "vit_", "deit", "beit", "swin", "eva", "cait", "xcit", "pvt_v2", "levit", "twins", "crossvit", "tnt_", "pit_",
    "convit", "mvitv2", "efficientformer", "hiera", "volo", "flexivit", "samvit", "mobilevit", "nextvit", "fastvit",
)
# torchvision's vision transformer classes (an in-memory module is described by its class name).
TORCH_VISION_TRANSFORMERS = frozenset({"VisionTransformer", "SwinTransformer"})
# Keras layers that are not one linear map of their input.
_NONLINEAR_HEADS = frozenset({"LSTM", "GRU", "SimpleRNN", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D"})

_PAPER = "arXiv 2610.13123"
_CONDITION = (f"BFE-W is derived for a decoupled linear last layer at interpolation ({_PAPER}), and the paper finds "
              "it uninformative with dropout before that layer (rho 0.00) or on vision transformers (rho +0.14)")
_DROPOUT_FINDING = (f"the paper ({_PAPER}) finds BFE-W uninformative when dropout precedes the last layer "
                    "(VGG, EfficientNet, MNASNet: Spearman rho 0.00)")
_VIT_FINDING = f"the paper ({_PAPER}) finds BFE-W does not track accuracy on vision transformers (ViT, Swin: rho +0.14)"
_HEAD_FINDING = (f"BFE-W is derived for one linear last layer on the last features ({_PAPER}); the paper's "
                 "derivation does not cover this head")
_HOLDS_FINDING = (f"the setting BFE-W is derived for (a decoupled linear last layer, {_PAPER}); this says nothing of "
                  "how well it will order models like this one: docs/evidence.md gives the paper's Spearman rho beside "
                  "the rho this project measures on its own zoos")


@dataclass(frozen=True)
class Rule:
    """One of the paper's conditions: a check that returns why it fails (None: it does not), what is broken in a few
    words; ``needs_head=False`` for a rule the architecture alone decides (it runs where no head is named)."""

    name: str
    check: Callable[[FrameworkDescription], Optional[str]]
    broken: str
    needs_head: bool = True


def _dropout(d: FrameworkDescription) -> Optional[str]:
    found = [(str(layer), float(rate)) for layer, rate in d.facts.get("dropout") or [] if float(rate) > 0]
    if not found:
        return None
    named = ", ".join(f"{layer} (rate {rate:g})" for layer, rate in found)
    return f"dropout on the features the head reads: {named}; {_DROPOUT_FINDING}{_head_rule(d)}"


def _head_rule(d: FrameworkDescription) -> str:
    rule = d.facts.get("head_rule")
    return f"; the head {d.head} is {rule}" if rule else ""


def _vision_transformer(d: FrameworkDescription) -> Optional[str]:
    family = str(d.facts.get("family") or "")
    if d.framework == "transformers" and family in VISION_TRANSFORMERS:
        return f"{d.model} is a vision transformer (model_type {family}); {_VIT_FINDING}"
    if d.framework == "timm" and family.startswith(TIMM_VISION_TRANSFORMERS):
        return f"timm's {family} is a vision transformer; {_VIT_FINDING}"
    if d.framework == "torch" and family in TORCH_VISION_TRANSFORMERS:
        return f"the module is a {family}, a vision transformer; {_VIT_FINDING}"
    return None


def _single_linear_head(d: FrameworkDescription) -> Optional[str]:
    if d.facts.get("no_head"):
        return f"no single head: {d.facts['no_head']}; {_HEAD_FINDING}"
    if others := d.facts.get("heads"):
        return (f"the output combines the head {d.head} with {', '.join(map(str, others))} "
                f"(several heads, no single last layer); {_HEAD_FINDING}")
    head_class = d.facts.get("head_class")
    if head_class in _NONLINEAR_HEADS:
        return f"the head {d.head} is a {head_class} layer, not one linear map of its input; {_HEAD_FINDING}"
    return None


RULES: tuple[Rule, ...] = (
    Rule("dropout_before_head", _dropout, "dropout on the head's input"),
    Rule("vision_transformer", _vision_transformer, "a vision transformer", needs_head=False),
    Rule("single_linear_head", _single_linear_head, "not one linear head"),
)


def applicability(description: Optional[FrameworkDescription],
                  config: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Whether BFE-W applies to the model ``description`` (None: the checkpoint has none) describes;
    ``config``, the checkpoint's ``config.json``, says what to add when none could be built from it.

    Returns:
        ``{"status": "holds" | "fails" | "unknown", "reasons": [...], "checked": [...], "summary": str}``:
        one reason per broken condition; ``checked``: the :data:`RULES` read; ``summary``: the table's line.

    Example:
        >>> d = FrameworkDescription("keras", "Sequential", ("dense/kernel",), "dense/kernel",
        ...                          facts={"dropout": [["drop", 0.5]], "head_class": "Dense"})
        >>> applicability(d)["status"], applicability(None)["status"]
        ('fails', 'unknown')
    """
    if description is None:
        why = ("its config.json names no model wbfe could build here (see model.framework), so the path into "
               f"the head cannot be checked; {_CONDITION}: install the framework it names (transformers, timm) "
               "to decide" if config else
               "no description of the model (a bare state dict, or weights without config.json), so the path "
               f"into the head cannot be checked; {_CONDITION}: add the model's config.json beside the weights, "
               "or score the framework's own file (.keras, .h5, .gguf), to decide")
        short = ("its config.json names no model wbfe could build here: install the framework it names to decide"
                 if config else "no description of the model: add its config.json beside the weights, or score the "
                 "framework's own file, to decide")
        return {"status": "unknown", "reasons": [why], "checked": [], "summary": short}
    # A head not named (a base model) is not a model without one: only the rules needing no head decide.
    head_unread = description.head is None and not description.facts.get("no_head")
    rules = [rule for rule in RULES if not (head_unread and rule.needs_head)]
    failed = [(rule.broken, reason) for rule in rules if (reason := rule.check(description)) is not None]
    checked = [rule.name for rule in rules]
    if failed:
        return {"status": "fails", "reasons": [reason for _, reason in failed], "checked": checked,
                "summary": f"{'; '.join(broken for broken, _ in failed)}: outside the setting BFE-W is derived for"}
    if head_unread:
        return {"status": "unknown", "checked": checked,
                "summary": "the description names no head: name it (--head) to decide", "reasons": [
            f"{description.model}: its description names no head ({description.note or 'none given'}); "
            f"the path into the head cannot be read; {_CONDITION}: name the head (--head) on a model "
            "with its classifier, or give the task model's config.json (a ...For...Classification), to decide"]}
    if description.facts.get("dropout_unrecorded"):
        # An inference graph (TFLite): converters drop Dropout, so its absence says nothing about training.
        return {"status": "unknown", "checked": checked,
                "summary": "an inference graph cannot show whether training put dropout before the head", "reasons": [
            f"{description.model}: {description.facts['dropout_unrecorded']}; the head {description.head} is one "
            f"linear map of the last features; {_CONDITION}, and whether training put dropout there cannot be "
            "read from this file: the training model's description (config.json, the .keras or .h5 file) would "
            "decide it"]}
    return {"status": "holds", "checked": checked,
            "summary": f"the conditions checked hold ({', '.join(checked)}); what that predicts: docs/evidence.md",
            "reasons": [f"{description.model}: the head {description.head} is one linear map of the last features "
                        f"with no dropout before it{_summary_stage(description)}: the conditions checked "
                        f"({', '.join(checked)}) hold, {_HOLDS_FINDING}{_head_rule(description)}"]}


def _summary_stage(d: FrameworkDescription) -> str:
    """A summary stage (linear + activation) the head reads makes the last features, as a pooler does."""
    if not (stage := d.facts.get("summary_stage")):
        return ""
    hidden = ", ".join(f"{layer} (rate {float(rate):g})" for layer, rate in d.facts.get("hidden_dropout") or [])
    before = (f"; its dropout {hidden} acts before its linear map, on a hidden layer's input, not on the "
              "features the head reads, as a dropout behind another layer is not counted anywhere") if hidden else ""
    return f" (the summary stage {stage}, a linear map and an activation, makes those features{before})"

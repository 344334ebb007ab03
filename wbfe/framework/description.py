"""What a checkpoint's own framework says about it, as plain data: the model's order of weights,
its head, its tied weights and how each weight is laid out (read by the planner and head finder)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Optional, Sequence

from wbfe.errors import InvalidOptionError

__all__ = ["Fallback", "Layout", "OUT_IN", "IN_OUT", "LAYOUTS", "FrameworkDescription", "out_in", "order_rows",
           "check_layout"]

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
    """``layout`` itself if it is one of :data:`LAYOUTS`, else InvalidOptionError."""
    if layout not in LAYOUTS:
        raise InvalidOptionError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return layout


def out_in(shape: Sequence[int], layout: str = OUT_IN) -> tuple[int, int]:
    """``(output, input)`` dimension of a weight of ``shape`` stored in ``layout``.

    Example:
        >>> out_in((3072, 768)), out_in((768, 3072), "in_out")
        ((3072, 768), (3072, 768))
    """
    return (int(shape[1]), int(shape[0])) if layout == IN_OUT else (int(shape[0]), int(shape[1]))


@dataclass(frozen=True)
class FrameworkDescription:
    """A checkpoint as its own framework describes it.

    Attributes:
        framework, model: ``transformers``, ``timm``, ``keras``, ``gguf``...; the model's class or architecture.
        order: the weights' names in the model's order (``named_parameters()``, the layer graph, the file).
        head: the stored name of the head's weight; None for none (a base model) or unknown (see ``note``).
        tied: a weight that is the same parameter as an earlier one -> that earlier weight's name.
        layouts: the weights whose layout is not :data:`OUT_IN`, with theirs.
        note: why the head is None, or what else the user should know.
        aliases: another name a weight may be stored under -> its name here (transformers 5 saves
            GPT-NeoX's in-memory ``lm_head.weight`` as ``embed_out.weight``).
        facts: the path into the head as plain data, read by :mod:`wbfe.framework.applicability`
            (``family``, ``dropout`` as ``[[layer, rate], ...]``, ``heads``, ``head_class``).
        roles: the weights whose role (``router``, ``expert``) the model's own classes say.
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
        return self.layouts.get(self.resolve(name), OUT_IN)

    def role_of(self, name: str) -> Optional[str]:
        """The role the model's classes give weight ``name`` (a split expert ``w[e]`` as ``w``), if any."""
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
        return {**asdict(self), "order": list(self.order)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FrameworkDescription":
        """The description :meth:`to_dict` gave ``data`` for; InvalidOptionError for any other shape."""

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
    """``rows`` (dicts with a ``name``, ``aliases`` applied) in the model's ``order``, else as they came.

    A row the order does not list (a per-expert copy of a fused stack) goes after the listed weight
    sharing the longest module path with it; rows that land together keep their stored order.

    Example:
        >>> rows = [{"name": n} for n in ("lm_head.weight", "h.10.w", "h.2.w", "embed.weight")]
        >>> [r["name"] for r in order_rows(rows, ["embed.weight", "h.2.w", "h.10.w", "lm_head.weight"])]
        ['embed.weight', 'h.2.w', 'h.10.w', 'lm_head.weight']
    """
    if not order:
        return list(rows)
    position = {name: i for i, name in enumerate(order)}
    # Each module path prefix -> the last listed weight under it: where an unlisted weight goes.
    prefixes = {name.rsplit(".", n)[0]: i for i, name in enumerate(order) for n in range(1, name.count(".") + 1)}

    def key(k: int, name: str) -> tuple[int, int, int]:
        name = (aliases or {}).get(name, name)
        if name in position:
            return position[name], 0, k
        stem = _EXPERT_SUFFIX.sub("", name)
        if stem in position:
            return position[stem], 1, k
        # the longest module path it shares with a listed weight; none: after the model, in stored order
        shared = (prefixes[p] for n in range(1, stem.count(".") + 1) if (p := stem.rsplit(".", n)[0]) in prefixes)
        return next(shared, len(order)), 1, k

    return [rows[k] for _, k in sorted((key(k, str(row.get("name", ""))), k) for k, row in enumerate(rows))]

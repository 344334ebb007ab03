"""A Keras model's head, and the dropout on its input, from its own ``model_config`` (an ``.h5``'s
attribute, a ``.keras``'s ``config.json``): walked back from the (first) output through the layers
without a weight matrix, into nested models (docs/checkpoints.md). Pure functions of the JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

__all__ = ["KerasLayer", "KerasHead", "keras_head", "keras_facts", "config_layers", "class_name"]

# Layer classes whose weight matrix computes their output, and the variable that is that matrix.
_KERNELS = {
    **{c: ("kernel",) for c in ("Dense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
                               "Conv3DTranspose", "Convolution1D", "Convolution2D", "Convolution3D",
                               "LSTM", "GRU", "SimpleRNN", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D")},
    **{c: ("pointwise_kernel",) for c in ("SeparableConv1D", "SeparableConv2D", "SeparableConvolution1D",
                                          "SeparableConvolution2D")},
    # Keras 3's legacy .h5 writer names a DepthwiseConv2D's variable ``kernel``.
    **{c: ("depthwise_kernel", "kernel") for c in ("DepthwiseConv1D", "DepthwiseConv2D")},
    "EinsumDense": ("kernel",),
}
# Layers that drop inputs while training, and the config field holding the rate.
_DROPOUTS = {"Dropout": "rate", "SpatialDropout1D": "rate", "SpatialDropout2D": "rate", "SpatialDropout3D": "rate",
             "AlphaDropout": "rate", "GaussianDropout": "rate", "GaussianNoise": "stddev"}
# Layers with a weight matrix that is no output layer: an embedding is looked up.
_NOT_OUTPUTS = ("Embedding", "MultiHeadAttention")


def class_name(layer: Any) -> str:
    """A layer config's class name without a registered package prefix (``my_pkg>Dense`` -> ``Dense``)."""
    return str(layer.get("class_name", "")).split(">")[-1] if isinstance(layer, dict) else ""


def config_layers(config: Any) -> list[dict[str, Any]]:
    """The layer configs of a (Sequential or Functional) model config, in model order."""
    if not isinstance(config, dict):
        return []
    inner = config.get("config", config)
    layers = inner.get("layers") if isinstance(inner, dict) else inner if isinstance(inner, list) else None
    return [layer for layer in layers or [] if isinstance(layer, dict)]


def _name(layer: dict[str, Any]) -> str:
    inner = layer.get("config")
    name = inner.get("name") if isinstance(inner, dict) else None
    return str(name if name is not None else layer.get("name", ""))


@dataclass(frozen=True)
class KerasLayer:
    """One layer: its names from the outermost model in (``("backbone", "conv1")``) and its class."""

    path: tuple[str, ...]
    class_name: str


@dataclass(frozen=True)
class KerasHead:
    """The layer that produces the model's output, and the variables (in preference) holding its matrix."""

    layer: KerasLayer
    variables: tuple[str, ...]
    note: Optional[str] = None
    dropout: tuple[tuple[str, float], ...] = ()


def keras_facts(head: Optional[KerasHead], why: Optional[str]) -> dict[str, Any]:
    """:attr:`FrameworkDescription.facts` of the graph whose :func:`keras_head` is ``(head, why)``: ``head_class``
    and ``dropout``, or ``no_head`` (why)."""
    if head is None:
        return {"family": "keras", "dropout": [], "no_head": why}
    return {"family": "keras", "head_class": head.layer.class_name,
            "dropout": [[layer, rate] for layer, rate in head.dropout]}


def keras_head(config: Any, prefix: tuple[str, ...] = (), seen: Optional[set[tuple[str, ...]]] = None
               ) -> tuple[Optional[KerasHead], Optional[str]]:
    """``(head, None)``: the layer whose weight matrix produces the model's (first) output; ``(None,
    why)`` where the config does not say (no layers, merged branches, a layer wbfe does not know)."""
    seen = set() if seen is None else seen
    if not (layers := config_layers(config)):
        return None, "the Keras model config lists no layers"
    by_name = {_name(layer): layer for layer in layers}
    inner = config.get("config", {}) if isinstance(config, dict) else {}
    outputs = list(dict.fromkeys(_history_names(inner.get("output_layers")))) if isinstance(inner, dict) else []
    sequential = class_name(config) == "Sequential" or not outputs
    chain = [layer for layer in layers if class_name(layer) != "InputLayer"]
    note = None
    if sequential:
        if not chain:
            return None, "the Keras model config lists only inputs"
        current: Optional[dict[str, Any]] = chain[-1]
    else:
        if len(outputs) > 1:
            note = f"the model has {len(outputs)} outputs ({', '.join(outputs)}); the first is taken"
        current = by_name.get(outputs[0])
    while current is not None:
        path = prefix + (_name(current),)
        if path in seen:
            return None, f"the Keras layer graph loops at {'/'.join(path)}"
        seen.add(path)
        cls = class_name(current)
        if cls in _KERNELS:
            dropout = tuple(_dropout_into(current, chain, by_name, sequential, prefix))
            return KerasHead(KerasLayer(path, cls), _KERNELS[cls], note, dropout), None
        if config_layers(current):  # a nested model: its own output layer
            found, why = keras_head(current, path, seen)
            if found is not None and note and not found.note:
                found = KerasHead(found.layer, found.variables, note, found.dropout)
            return found, why
        if cls in _NOT_OUTPUTS:
            return None, f"the model's output comes from {'/'.join(path)}, a {cls}: no head"
        if sequential:
            index = chain.index(current)
            current = chain[index - 1] if index > 0 else None
            continue
        inbound = list(dict.fromkeys(_history_names(current.get("inbound_nodes"))))
        if len(inbound) != 1:
            what = "several layers" if inbound else "no layer"
            return None, f"the model's output layer {'/'.join(path)} ({cls}) reads {what}: no single head"
        current = by_name.get(inbound[0])
    return None, "no layer with a weight matrix produces the Keras model's output"


def _dropout_into(head: dict[str, Any], chain: list[dict[str, Any]], by_name: dict[str, dict[str, Any]],
                  sequential: bool, prefix: tuple[str, ...]) -> Iterator[tuple[str, float]]:
    """The dropout layers with rate > 0 between ``head`` and what feeds it, nearest the head first."""
    current: Optional[dict[str, Any]] = head
    seen: set[str] = set()
    while current is not None and _name(current) not in seen:
        seen.add(_name(current))
        if sequential:
            index = chain.index(current) if current in chain else 0
            current = chain[index - 1] if index > 0 else None
        else:
            inbound = list(dict.fromkeys(_history_names(current.get("inbound_nodes"))))
            current = by_name.get(inbound[0]) if len(inbound) == 1 else None
        if current is None:
            return
        cls = class_name(current)
        if cls in _KERNELS or cls in _NOT_OUTPUTS or config_layers(current) or cls == "InputLayer":
            return
        if cls in _DROPOUTS:
            inner = current.get("config")
            rate = inner.get(_DROPOUTS[cls]) if isinstance(inner, dict) else None
            if isinstance(rate, (int, float)) and rate > 0:
                yield "/".join(prefix + (_name(current),)), float(rate)


def _history_names(nodes: Any) -> list[str]:
    """Layer names a node structure refers to: Keras 3's ``{"keras_history": [name, node, tensor]}``,
    Keras 2's ``[name, node, tensor, kwargs]``."""
    if isinstance(nodes, dict):
        history = nodes.get("keras_history")
        if isinstance(history, list) and history and isinstance(history[0], str):
            return [history[0]]
        return [name for item in nodes.values() for name in _history_names(item)]
    if isinstance(nodes, list):
        if len(nodes) >= 3 and isinstance(nodes[0], str) and isinstance(nodes[1], int):
            return [nodes[0]]
        return [name for item in nodes for name in _history_names(item)]
    return []

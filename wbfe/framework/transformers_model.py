"""A Hugging Face ``config.json`` described by transformers itself: the class ``architectures`` names,
built on the meta device (docs/checkpoints.md). Code a checkpoint ships with (``auto_map``) is never
run: such a model is left to wbfe's rules, as is one transformers does not know or cannot build."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from typing import Any, Optional, Union

from wbfe._deps import TORCH_INSTALL, torch_installed
from wbfe.framework.description import Fallback, FrameworkDescription
from wbfe.framework.forward_trace import head_input_dropouts
from wbfe.framework.head_facts import head_facts
from wbfe.framework.parameters import module_roles, shared_parameters, transposed_weights, weight_name
from wbfe.framework.stored import cached
from wbfe.render.diagnostics import route_logger

__all__ = ["describe_transformers", "describe_built", "Fallback", "LABEL_TASKS"]


# ``architectures`` suffixes whose head has a fixed number of outputs, whatever ``num_labels`` says (the config
# rules of wbfe.engine.heads read it too).
LABEL_TASKS = {"ForQuestionAnswering": 2, "ForMultipleChoice": 1}
# a task model whose head maps to ``num_labels`` classes
_CLASSIFICATION = re.compile(r"For\w*Classification")


def describe_transformers(config: dict[str, Any]) -> Union[FrameworkDescription, Fallback]:
    """The model ``config`` (a parsed ``config.json``) describes, as transformers builds it; or a
    :class:`Fallback` saying why there is no description."""
    try:
        key = json.dumps(config, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return Fallback("config.json holds values that are not JSON")
    return _describe(key)


@functools.lru_cache(maxsize=64)
def _describe(key: str) -> Union[FrameworkDescription, Fallback]:
    config = json.loads(key)
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    if not isinstance(arch, str) or not arch.isidentifier():
        return Fallback("config.json names no architecture")
    if not torch_installed():  # the model is built with torch, on its meta device
        return Fallback(f"torch is not installed, so {arch} is not built ({TORCH_INSTALL})")
    return cached("transformers", ("transformers", "torch"), {"config": config}, lambda: _built(config, arch))


def _built(config: dict[str, Any], arch: str) -> Union[FrameworkDescription, Fallback]:
    try:
        import transformers
    except ImportError:
        return Fallback(f"transformers is not installed, so {arch} is not built (pip install transformers)")
    route_logger("transformers")  # its config checks and RoPE notices: wbfe's diagnostics
    model_class = getattr(transformers, arch, None) if not arch.startswith("_") else None
    if model_class is None or not hasattr(model_class, "config_class"):
        if isinstance(config.get("auto_map"), dict):
            return Fallback(f"{arch} is defined by the checkpoint's own code (auto_map), which wbfe never runs")
        return Fallback(f"transformers {transformers.__version__} has no model class {arch}")
    skip_init: Any = contextlib.nullcontext
    with contextlib.suppress(ImportError):
        from transformers.initialization import no_init_weights as skip_init
    model_type = config.get("model_type")
    try:
        import torch

        config_class: Any = getattr(model_class, "config_class", None)
        if isinstance(model_type, str) and model_type in transformers.CONFIG_MAPPING:
            config_class = transformers.CONFIG_MAPPING[model_type]
        parsed = config_class.from_dict({k: v for k, v in config.items() if k != "auto_map"})
        # A declared quantization applies to loaded weights: the skeleton is the float layout the reader
        # dequantises to. no_init_weights (as from_pretrained) skips the initialisers, half the build even
        # on the meta device; it leaves ties undone, which all_tied_weights_keys then gives.
        with torch.device("meta"), skip_init():
            model = model_class(parsed)
    except Exception as exc:  # noqa: BLE001 - any failure to build means "use the rules"
        return Fallback(f"transformers could not build {arch} from config.json ({type(exc).__name__})")
    return _read(model, arch, skeleton=True)


def describe_built(model: Any) -> FrameworkDescription:
    """A transformers model already built, read as the skeleton is; its weights are not touched."""
    return _read(model, type(model).__name__, skeleton=False)


def _read(model: Any, arch: str, *, skeleton: bool) -> FrameworkDescription:
    declared = getattr(model, "all_tied_weights_keys", None)  # transformers 5: {tied weight: its source}
    tied: dict[str, str] = {str(k): str(v) for k, v in declared.items()} if isinstance(declared, dict) else {}
    names, shared = shared_parameters(model)
    for name, source in shared.items():  # tied by sharing the parameter (older transformers tie in __init__)
        tied.setdefault(name, source)
    order = [name for name in names if name not in tied]
    try:
        from transformers.pytorch_utils import Conv1D  # GPT-2's, stored [in, out]

        layouts = transposed_weights(model, also=(Conv1D,))
    except ImportError:
        layouts = transposed_weights(model)
    head, note = _head(model, arch)
    static = head_facts(model, head)
    facts = {"family": str(getattr(model.config, "model_type", "") or ""), **static,
             **_traced(model, head, skeleton, static)}
    saved = _saved_names(model, order + list(tied))
    rename = saved.get
    return FrameworkDescription(
        "transformers", arch, tuple(rename(n, n) for n in order),
        rename(head, head) if head is not None else None,
        {rename(k, k): rename(v, v) for k, v in tied.items()}, {rename(k, k): v for k, v in layouts.items()}, note,
        aliases=dict(saved),  # a checkpoint written with the in-memory names
        facts=facts, roles={rename(k, k): v for k, v in module_roles(model).items()},
    )


def _traced(model: Any, head: Optional[str], skeleton: bool, static: dict[str, Any]) -> dict[str, Any]:
    """The dropout on the head's input from the skeleton's forward pass (:mod:`wbfe.framework.forward_trace`);
    else the module tree's reading stands, ``dropout_read`` says why. Real weights are never run."""
    if head is None:
        return {}
    if not skeleton and not all(p.device.type == "meta" for p in model.parameters()):
        return {"dropout_read": "module tree: a built model with weights is not run"}
    if skeleton:
        # a tensor made with a fixed device (XLNet's torch.FloatTensor mask_emb) ignores the meta context
        model.to("meta")
    traced = head_input_dropouts(model, head)
    if isinstance(traced, str):
        return {"dropout_read": f"module tree: {traced}"}
    facts: dict[str, Any] = {"dropout": traced.dropout, "dropout_read": "forward pass on the meta device"}
    stage = static.get("summary_stage")
    if stage and not (traced.feeds or "").startswith(f"{stage}."):
        # a summary stage beside the head that the head does not read (GPT-2 double heads: the
        # multiple-choice summary beside lm_head)
        facts.update(summary_stage=None, hidden_dropout=[])
    return facts


def _saved_names(model: Any, names: list[str]) -> dict[str, str]:
    """The names ``save_pretrained`` writes, where transformers' conversion mapping renames them on saving
    (reversed as ``revert_weight_conversion`` does); fused-expert converters are left to ``order_rows``."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange, WeightRenaming, apply_renamings

        conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False) or []
                       if not isinstance(c, PrefixChange)][::-1]
        renamings = [r for r in (c.reverse_transform() for c in conversions) if isinstance(r, WeightRenaming)]
    except Exception:  # noqa: BLE001 - older or newer transformers without this API: names as in memory
        return {}
    out = {}
    for name in names:
        try:
            saved = apply_renamings(name, renamings)
        except Exception:  # noqa: BLE001 - a pattern this name trips: it keeps its in-memory name
            saved = name
        if saved != name:
            out[name] = saved
    return out


def _head(model: Any, arch: str) -> tuple[Optional[str], Optional[str]]:
    import torch

    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is not None and getattr(output, "weight", None) is not None:
        return weight_name(model, output), None
    labels: Optional[int] = next((n for suffix, n in LABEL_TASKS.items() if arch.endswith(suffix)), None)
    if labels is None and _CLASSIFICATION.search(arch):  # ...ForImageClassificationWithTeacher too (DeiT)
        labels = int(getattr(model.config, "num_labels", 0) or 0)
    if labels is None:
        return None, f"{arch} has no output embeddings or classifier (a base model); pass --head NAME"
    found = [module for module in model.modules()
             if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d))
             and getattr(module, "out_features", getattr(module, "out_channels", None)) == labels]
    if not found:
        return None, f"{arch}: no layer of {labels} outputs in the model"
    return weight_name(model, found[-1]), None

"""Fused mixture-of-experts tensors: one 3-D tensor ``[E, ·, ·]`` holds a layer's E expert matrices.

Each is read as ``<tensor>[e]``, oriented ``[out, in]`` by the config's hidden size or the model's convention, a fused
``gate_up`` split into ``.gate`` and ``.up`` (docs/checkpoints.md describes the rules)."""

from __future__ import annotations

import functools
import re
import threading
from typing import Any, Iterable, Iterator, Optional

from wbfe.sources import TensorEntry

__all__ = ["expand_experts", "is_expert_stack", "config_value"]

Item = tuple[TensorEntry, Optional[str]]

# model_type of Hugging Face models whose fused gate_up rows are [gate; up] (they `.chunk(2)` it),
# from transformers 5.24's modeling files; gpt-oss interleaves them.
_CONCATENATED = frozenset("""
afmoe aria axk1 axk2 bailing_hybrid beam cohere2_moe deepseek_ocr2 deepseek_v2 deepseek_v3 deepseek_v32
deepseek_v4 dots1 dots3_note ernie4_5_moe ernie4_5_vl_moe exaone_moe flex_olmo gemma4 gemma4_text glm4_moe
glm4_moe_lite glm4v_moe glm4v_moe_text glm_moe_dsa granitemoe granitemoe_swa granitemoehybrid granitemoeshared
hunyuan_v1_moe jamba kimi_linear lfm2_moe llama4 llama4_text longcat_flash minimax minimax_m2 mistral4
mixtral olmoe openai_privacy_filter phimoe qwen2_moe qwen3_5_moe qwen3_5_moe_text qwen3_moe qwen3_next
qwen3_omni_moe qwen3_vl_moe qwen3_vl_moe_text solar_open
""".split())
_INTERLEAVED = frozenset({"gpt_oss"})
# model_type whose expert stacks are [E, in, out] (used as x @ W[e]).
_IN_OUT = frozenset({"gpt_oss", "llama4", "llama4_text", "openai_privacy_filter"})
_EXPERT_COUNT = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_GATE_UP = re.compile(r"(gate_up|input_linear|w13|w1_w3)")
_DOWN = re.compile(r"(down|output_linear|w2)")


def config_value(config: Optional[dict[str, Any]], key: str) -> Any:
    """``key`` of the config or of a multimodal model's language model's config (``text_config``,
    ``language_config`` or ``llm_config``, the first that has it); None where none has it or there is no config."""
    if not config or key in config:
        return (config or {}).get(key)
    return next((inner[key] for sub in ("text_config", "language_config", "llm_config")
                 if isinstance(inner := config.get(sub), dict) and key in inner), None)


def _under_experts(name: str) -> bool:
    """Under an ``experts`` module (not one expert's own ``experts.3.``), or a GGUF expert stack
    (``blk.0.ffn_gate_exps.weight``)."""
    return (("experts" in name.split(".")[:-1] and not re.search(r"\.experts\.\d+\.", name))
            or re.search(r"_exps(\.weight|\.bias)?$", name) is not None)


def is_expert_stack(name: str, shape: tuple[int, ...], config: Optional[dict[str, Any]] = None) -> bool:
    """Is this 3-D tensor a stack of expert matrices (not a convolution kernel)?"""
    if len(shape) != 3 or shape[0] < 1:
        return False
    if _under_experts(name):
        return True
    count = next((c for key in _EXPERT_COUNT if isinstance(c := config_value(config, key), int)), None)
    hidden = config_value(config, "hidden_size")
    return count is not None and shape[0] == count and hidden in shape[1:]


def expand_experts(items: Iterable[Item], config: Optional[dict[str, Any]] = None) -> Iterator[Item]:
    """Replace each fused expert stack in the stream by its expert matrices; mark bias stacks."""
    model_type = str(config_value(config, "model_type") or "")
    hidden = config_value(config, "hidden_size")
    for entry, reason in items:
        if reason is not None:
            yield entry, reason
        elif len(entry.shape) == 2 and _under_experts(entry.name) and re.search(r"bias$", entry.name):
            yield entry, "bias (one per expert, stacked)"
        elif is_expert_stack(entry.name, entry.shape, config) and entry.dtype.startswith(("float", "bfloat")):
            yield from _split_stack(entry, model_type, hidden if isinstance(hidden, int) else None)
        else:
            yield entry, None


def _split_stack(entry: TensorEntry, model_type: str, hidden: Optional[int]) -> Iterator[Item]:
    experts, a, b = entry.shape
    if hidden is not None and a != b and hidden in (a, b):
        # The hidden size is the output of a down projection and the input of the others.
        transpose = (b == hidden) if _DOWN.search(entry.name) else (a == hidden)
    else:
        transpose = model_type in _IN_OUT
    out, inp = (b, a) if transpose else (a, b)
    split = None
    if _GATE_UP.search(entry.name) and out % 2 == 0:
        split = "interleaved" if model_type in _INTERLEAVED else "halves" if model_type in _CONCATENATED else None
    half = out // 2
    # (name suffix, rows of the expert's matrix, their count): the whole matrix, or its gate and up halves
    pieces: list[tuple[str, Optional[slice], int]] = [("", None, out)] if split is None else [
        (f".{part}", slice(k, None, 2) if split == "interleaved" else slice(k * half, (k + 1) * half), half)
        for k, part in enumerate(("gate", "up"))]
    holder = _Stack(entry, transpose, experts * len(pieces))
    for e in range(experts):
        for suffix, rows, n_rows in pieces:
            yield TensorEntry(name=f"{entry.name}[{e}]{suffix}", shape=(n_rows, inp), dtype=entry.dtype,
                              load=functools.partial(holder.take, e, rows), quant=entry.quant), None


class _Stack:
    """The fused tensor, read once and held while its experts are handed out (views, no copies),
    then released: one stack in memory at a time, as a stored tensor of that size would be."""

    def __init__(self, entry: TensorEntry, transpose: bool, uses: int):
        self._entry = entry
        self._transpose = transpose
        self._left = uses
        self._tensor: Any = None
        self._lock = threading.Lock()

    def take(self, e: int, rows: Optional[slice]) -> Any:
        with self._lock:
            if self._tensor is None:
                self._tensor = self._entry.load()
            tensor = self._tensor
            self._left -= 1
            if self._left <= 0:
                self._tensor = None
        matrix = tensor[e].T if self._transpose else tensor[e]
        return matrix[rows] if rows is not None else matrix

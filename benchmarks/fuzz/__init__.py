"""Coverage-guided fuzz harnesses of wbfe's readers (issue #33 §1), one module per reader.

Each module (``harness_<reader>.py``) exposes ``NAME``, ``fuzz_one(data: bytes) -> None`` and
``seeds() -> dict[str, bytes]``.
``fuzz_one`` feeds the bytes to the reader through wbfe's public API and raises on a finding: any
exception that is not a :class:`wbfe.errors.WbfeError`, or an :class:`AssertionError` for a result
that breaks an invariant (every tensor read or skipped with a reason; every tensor's shape and
dtype as its entry declares; no number from bytes outside the tensor; every tensor accounted for
by the engine). ``seeds`` builds valid files of the format with the format's own writers.

``benchmarks/fuzz_readers.py`` runs them under atheris (libFuzzer); ``tests/test_fuzz_corpus.py``
replays the seeds and ``tests/fuzz_corpus/<reader>/`` (the findings, once fixed) without atheris.
"""

from __future__ import annotations

# The harness modules, one per reader, by the name the driver and the corpus folders use.
HARNESSES = (
    "safetensors", "safetensors_index", "torch", "torchscript", "gguf", "keras", "onnx", "flax", "npz",
    "peft", "zoo", "rank_cache", "tflite",
)

#!/usr/bin/env bash
# Everything the performance issue measures on a GPU, in one run of a few minutes: the CUDA tests
# (GPU against CPU numbers) and benchmarks/bench_gpu.py on a generated 1.2e9-parameter bfloat16
# checkpoint. Written for the lent H200 (its python3 has torch and every package wbfe needs; wbfe
# runs from the checkout), usable on any CUDA machine:
#
#     bash benchmarks/gpu_check.sh              # logs and JSON to $OUT, else benchmarks/results
#
# Exit status: the tests' (the benchmark runs either way).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

"$python" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu_smi.txt"
# Only the files that hold CUDA tests: the others import packages a GPU machine may lack.
"$python" -m pytest -p no:cacheprovider -m gpu -rs tests/test_spectra.py tests/test_scoring.py 2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
"$python" benchmarks/bench_gpu.py --params 1.2e9 --device cuda --out "$out" 2>&1 | tee "$out/gpu_bench.log"
exit "$status"

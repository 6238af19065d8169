#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over a small subset of the CUDA tests. Needs a GPU
# and an installed attnlab built with CUDA; PYTHON selects the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# The CUDA toolkit's bin/ is often not on PATH.
default_sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
sanitizer=${COMPUTE_SANITIZER:-$default_sanitizer}
# small_problems covers every kernel: generic (all head-size families) and tensor-core.
subset=(tests/python/test_attention_cuda.py -p no:cacheprovider
        -k "small_problems or fully_masked or many_batch_dimensions")
# Without the caching allocator every tensor is its own allocation, so memcheck sees
# out-of-bounds accesses that would otherwise land inside a cached block.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  "$sanitizer" --tool "$tool" --error-exitcode 1 "$python" -m pytest -q "${subset[@]}"
done

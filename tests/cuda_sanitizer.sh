#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over a small subset of the CUDA tests. Needs a GPU
# and an installed attnlab built with CUDA; PYTHON selects the interpreter (default python3).
# SANITIZER_TOOLS picks the tools (default "memcheck racecheck"); SANITIZER_ARGS adds options
# to every compute-sanitizer call (e.g. "--kernel-name kns=attnlab": only attnlab's kernels).
# pytest runs verbosely, so the log names every test the sanitizer watched and its outcome.
# SANITIZER_OPT_IN=1 runs with the opt-in kernels switched on (ATTNLAB_CUDA_FLASH_WEIGHTS=1 and
# ATTNLAB_CUDA_FLASH_WARPS=8, which cpp/src/cuda/ops.cpp reads at every call) over the tests
# that reach the flash forward, with and without weights.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# The CUDA toolkit's bin/ is often not on PATH.
default_sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
sanitizer=${COMPUTE_SANITIZER:-$default_sanitizer}
read -r -a tools <<<"${SANITIZER_TOOLS:-memcheck racecheck}"
read -r -a extra <<<"${SANITIZER_ARGS:-}"
# small_problems covers every kernel: generic (all head-size families), tensor-core (the flash
# forward and backward) and sparse (sparsemax, entmax-1.5, general α).
subset=(tests/python/operator/test_attention_cuda.py tests/python/operator/test_sparse_attention_cuda.py
        -p no:cacheprovider -v -rs
        -k "small_problems or fully_masked or many_batch_dimensions")
if [[ ${SANITIZER_OPT_IN:-0} == 1 ]]; then
  # The switches change only the flash forward: the tests that reach it are the tensor-core
  # small problems (8-warp blocks, no weights) and the half-precision weights tests (the flash
  # forward's weights pass, in 8-warp blocks too), from one to several 64-row tiles.
  export ATTNLAB_CUDA_FLASH_WEIGHTS=1 ATTNLAB_CUDA_FLASH_WARPS=8
  subset=(tests/python/operator/test_attention_cuda.py -p no:cacheprovider -v -rs
          -k "tensor_core_path or half_precision_weights")
  echo "== opt-in kernels: ATTNLAB_CUDA_FLASH_WEIGHTS=1 ATTNLAB_CUDA_FLASH_WARPS=8"
fi
# Without the caching allocator every tensor is its own allocation, so memcheck sees
# out-of-bounds accesses that would otherwise land inside a cached block.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
"$sanitizer" --version | tail -n 1
# racecheck watches attnlab's kernels only: the tests compare against torch's SDPA, and in the
# first GPU run (H200, torch 2.11, cuDNN 9.19, 32 tests in 55 s) racecheck reported hazards in
# cuDNN's fused SDPA kernels (cudnn_generated_fort_native_sdpa_sm90_flash_*), none in
# attnlab's; those are not ours to fix and would fail the run. memcheck watches every kernel.
own_kernels=(--kernel-name kns=attnlab)
for tool in "${tools[@]}"; do
  filter=()
  [[ $tool == racecheck ]] && filter=("${own_kernels[@]}")
  echo "== compute-sanitizer --tool $tool ${filter[*]} ${extra[*]}"
  "$sanitizer" --tool "$tool" --error-exitcode 1 "${filter[@]}" "${extra[@]}" "$python" -m pytest "${subset[@]}"
done

#!/usr/bin/env bash
# attnlab as a CPU with AVX2 but no AVX-512 runs it, on any x86-64 machine with AVX2: builds the
# library with the CMake option ATTNLAB_CPU_AVX2_ONLY (no x86-64-v4 clones, no AVX-512 paths)
# in build-avx2/, puts it with python/attnlab's sources in build-avx2/site/, and then
#   tests/avx2_only_build.sh              runs the GoogleTests and the numerics tests on it;
#   tests/avx2_only_build.sh CMD ARGS...  runs CMD with that package first on PYTHONPATH, e.g.
#     tests/avx2_only_build.sh python3 benchmarks/attention_cpu.py --dtypes float32
# ATTNLAB_CPU_ISA=avx2 only chooses the AVX2 kernels among what the CPU's loader picked (the
# x86-64-v4 clones on an AVX-512 CPU); this build leaves the loader nothing else to pick. Needs
# the installed package's dependencies (torch, pybind11, libgtest-dev, ninja). About 4 minutes
# on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=build-avx2
python=${PYTHON:-python3}

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNLAB_CPU_AVX2_ONLY=ON \
      -DATTNLAB_CUDA=OFF -DATTNLAB_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$python")" >/dev/null
cmake --build "$build"

site=$build/site
rm -rf "$site"
mkdir -p "$site"
cp -r python/attnlab "$site/"
cp "$build"/_C*.so "$build/libattnlab.so" "$build/_build.py" "$site/attnlab/"
# ATTNLAB_CPU_ISA=avx2 as well, for the tests' own view of the CPU (tests/python/cpuinfo.py).
# LD_LIBRARY_PATH: the extension module would otherwise find its library through RUNPATH.
export PYTHONPATH="$root/$site${PYTHONPATH:+:$PYTHONPATH}" ATTNLAB_CPU_ISA=avx2 \
       LD_LIBRARY_PATH="$root/$site/attnlab${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$python" - <<'PY'
import attnlab
info = attnlab.build_info()
assert info["cpu_clone_targets"] == "x86-64-v3,default", f"not the AVX2-only build: {info}"
print(f"attnlab from {attnlab.__file__}: clones {info['cpu_clone_targets']}, vector kernels "
      f"{info['cpu_vector_kernels']}, float32 products {info['cpu_float32_products']}")
PY

if [ $# -gt 0 ]; then
  exec "$@"
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
# The numerics of the small and blocked paths, the encoder block, the modules and the sparse
# normalizers (tests/python/operator/test_cpu_isa_avx2.py runs the first six again under the
# cap alone).
cd tests/python
"$python" -m pytest -q -p no:cacheprovider operator/test_small_attention_path.py \
    operator/test_attention.py operator/test_attention_autograd.py \
    operator/test_numerical_edge_cases.py operator/test_reduced_precision_cpu.py \
    operator/test_build_info.py modules/test_encoder_block_op.py modules/test_nn_modules.py \
    operator/test_sparse_attention.py operator/test_additive_and_attention_layers.py

#!/usr/bin/env bash
# Compiles attnlab's core, libattnlab.so with its CUDA kernels, on a machine WITHOUT a GPU,
# against the torch release of the GPU machine, so that the GPU machine skips the compile (356 s
# on the 16 cores of an H200's host, two thirds of a nine-minute call). run.sh --core FILE then
# installs a wheel built there earlier and puts this core in it (README.md beside this).
#
#   benchmarks/gpu/build_core.sh TORCH_VERSION [CUDA_ARCH]      e.g. 2.11.0 90
#
# Needs nvcc, CMake, ninja, network access to PyPI, and a Python whose site-packages hold
# NVIDIA's CUDA runtime packages of the same CUDA major version (those of a CUDA build of torch:
# the downloaded torch is imported against them, only to read its version and paths). Writes
# .gpu/core/libattnlab.so and .gpu/core/SOURCE (the commit and whether the tree was modified).
set -euo pipefail
torch_version=${1:?usage: build_core.sh TORCH_VERSION [CUDA_ARCH], e.g. 2.11.0 90}
arch=${2:-90}
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
venv=$repo/.gpu/torch-$torch_version
build=$repo/.gpu/core-build-$torch_version-sm$arch
if [[ ! -x $venv/bin/python ]]; then
  "$python" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-deps "torch==$torch_version"
fi
site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
LD_LIBRARY_PATH=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | paste -sd: -)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
if ! "$venv/bin/python" -c "import torch; assert torch.version.cuda, 'not a CUDA build'; print('torch', torch.__version__)"; then
  echo "build_core.sh: torch $torch_version does not import here (see above); it needs the NVIDIA" \
       "runtime packages of its CUDA major version in $site" >&2
  exit 1
fi
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNLAB_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DATTNLAB_BUILD_TESTS=OFF -DATTNLAB_BUILD_EXAMPLES=OFF \
      -DPython_EXECUTABLE="$venv/bin/python" >/dev/null
ninja -C "$build" attnlab
mkdir -p "$repo/.gpu/core"
cp "$build/libattnlab.so" "$repo/.gpu/core/libattnlab.so"
{
  echo "commit $(git -C "$repo" rev-parse HEAD)$(git -C "$repo" diff --quiet HEAD -- cpp cmake CMakeLists.txt || echo ' + uncommitted changes')"
  echo "torch $torch_version, CUDA architecture $arch, built $(date -u '+%Y-%m-%d %H:%M UTC')"
} >"$repo/.gpu/core/SOURCE"
cat "$repo/.gpu/core/SOURCE"
du -h "$repo/.gpu/core/libattnlab.so"

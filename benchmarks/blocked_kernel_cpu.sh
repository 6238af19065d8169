#!/usr/bin/env bash
# The blocked CPU attention kernels timed on their own (benchmarks/blocked_kernel_cpu.cpp):
# compiles that program against the library in build/ (or ATTNLAB_LIB_DIR) and torch's headers
# into build-bench/, then runs
#   benchmarks/blocked_kernel_cpu.sh [--heads N] [--len L] [--len-k LK] [--dim E] [--threads T]
#                                    [--backward] [--weights]
# which times the causal and the plain problem alternately and prints both and their ratio.
# The program finds libattnlab.so through its RUNPATH (the library folder) unless
# LD_LIBRARY_PATH names another: for an A/B, keep copies of two builds' libattnlab.so in two
# folders and run the same binary alternately with LD_LIBRARY_PATH=each. Needs the Python
# package's torch and a built library (ninja -C build). About 20 seconds of compiling.
set -euo pipefail
cd "$(dirname "$0")/.."
lib_dir=$(realpath "${ATTNLAB_LIB_DIR:-build}")
[ -f "$lib_dir/libattnlab.so" ] || { echo "no libattnlab.so in $lib_dir (build it first)" >&2; exit 2; }
torch_dir=$("${PYTHON:-python3}" -c "import os, torch; print(os.path.dirname(torch.__file__))")
out=build-bench/blocked_kernel_cpu
mkdir -p build-bench
"${CXX:-c++}" -O2 -std=gnu++20 -Wall -Wextra -I cpp/src -isystem "$torch_dir/include" \
  -isystem "$torch_dir/include/torch/csrc/api/include" benchmarks/blocked_kernel_cpu.cpp \
  -o "$out" -L "$lib_dir" -lattnlab -L "$torch_dir/lib" -ltorch_cpu -lc10 \
  -Wl,-rpath,"$lib_dir" -Wl,-rpath,"$torch_dir/lib"
exec "$out" "$@"

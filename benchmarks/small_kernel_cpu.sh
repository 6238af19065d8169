#!/usr/bin/env bash
# The small attention kernels timed on their own (benchmarks/small_kernel_cpu.cpp): compiles
# them from this tree with the library's flags for those files into build-bench/, then runs
#   benchmarks/small_kernel_cpu.sh [--heads N] [--len L] [--dim E] [--weights] [--causal] [--avx2]
# BENCH_OUT=path names the binary instead (to keep two builds for an A/B: run them
# alternately); AVX2_ONLY=1 compiles as the CMake option ATTNLAB_CPU_AVX2_ONLY does. Needs g++
# only (no torch). About 2 minutes of compiling on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${BENCH_OUT:-build-bench/small_kernel_cpu}
mkdir -p "$(dirname "$out")"
defines=()
if [ "${AVX2_ONLY:-0}" = 1 ]; then defines+=(-DATTNLAB_CPU_AVX2_ONLY=1); fi
# As CMakeLists.txt compiles these files (Release): -O3, OpenMP SIMD pragmas, no RTL GCSE.
"${CXX:-c++}" -O3 -DNDEBUG -std=gnu++20 -fopenmp-simd -fno-gcse -fno-gcse-after-reload \
  -Wno-psabi -Wall -Wextra "${defines[@]}" -I cpp/src \
  benchmarks/small_kernel_cpu.cpp cpp/src/cpu/attention/small_attention.cpp \
  cpp/src/cpu/attention/small_attention_avx2.cpp cpp/src/cpu/isa/isa.cpp -o "$out"
exec "$out" "$@"

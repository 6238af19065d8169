"""The kernels' AVX2 paths on any CPU with AVX2: ``ATTNLAB_CPU_ISA=avx2`` makes attnlab choose
its kernels as on a CPU with AVX2 and FMA but no AVX-512 (the small attention kernels in 32-byte
vectors, the softmax's AVX2 row passes, float32 products through the BLAS), so the numerics
tests of the small and blocked paths run again through them in a child process. On AVX-512
machines nothing else reaches that code."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab
import cpuinfo

HERE = Path(__file__).resolve().parent

# The files whose tests run again under the cap: the small path's every row split, key count
# and head size; values, masks and gradients of both paths; the edge cases (NaN, -inf rows);
# bfloat16 and float16 (widened to float32 where the CPU lacks AVX512-BF16).
CAPPED_FILES = ["test_small_attention_path.py", "test_attention.py",
                "test_attention_autograd.py", "test_numerical_edge_cases.py",
                "test_reduced_precision_cpu.py", "test_build_info.py"]

needs_avx2 = pytest.mark.skipif(not {"avx2", "fma"} <= set(cpuinfo.cpu_flags()),
                                reason="the CPU has no AVX2 and FMA")


def _capped(args, cap="avx2", **kwargs):
    """python3 with these arguments in a child process under ATTNLAB_CPU_ISA=cap."""
    env = dict(os.environ, ATTNLAB_CPU_ISA=cap)
    return subprocess.run([sys.executable, *args], env=env, cwd=HERE,
                          capture_output=True, text=True, **kwargs)


@needs_avx2
def test_the_cap_selects_the_avx2_kernels():
    result = _capped(["-c", "import attnlab; i = attnlab.build_info(); "
                            "print(i['cpu_vector_kernels'], i['cpu_float32_products'])"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["avx2", "blas"]


def test_an_unknown_cap_is_named_and_ignored():
    result = _capped(["-c", "import attnlab; print(attnlab.build_info()['cpu_vector_kernels'])"],
                     cap="avx9")
    assert result.returncode == 0, result.stderr
    assert "ATTNLAB_CPU_ISA=avx9" in result.stderr and "expected avx2 or native" in result.stderr
    assert result.stdout.strip() == attnlab.build_info()["cpu_vector_kernels"]


@pytest.mark.long  # six test files again in a child process: over 20 s on 2 cores
@needs_avx2
@pytest.mark.skipif(attnlab.build_info()["cpu_vector_kernels"] == "avx2",
                    reason="this CPU has no AVX-512: the suite itself runs those files through "
                           "the AVX2 kernels")
def test_numerics_tests_pass_through_the_avx2_kernels():
    result = _capped(["-m", "pytest", "-q", "-p", "no:cacheprovider", *CAPPED_FILES],
                     timeout=1800)
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
    assert result.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail

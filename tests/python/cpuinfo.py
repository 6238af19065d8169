"""What /proc/cpuinfo says this CPU has: the tests' own view, independent of the library's
(which asks the CPU itself)."""

import os


def cpu_flags():
    """The flags of the first CPU in /proc/cpuinfo (empty where it cannot be read), without the
    AVX-512 and AMX ones under ATTNLAB_CPU_ISA=avx2, where attnlab chooses its kernels as on a
    CPU that lacks them."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return []
    if os.environ.get("ATTNLAB_CPU_ISA") == "avx2":
        flags = [f for f in flags if not f.startswith(("avx512", "amx"))]
    return flags

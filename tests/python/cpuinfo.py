"""What /proc/cpuinfo says this CPU has: the tests' own view, independent of the library's
(which asks the CPU itself)."""


def cpu_flags():
    """The flags of the first CPU in /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f
                         if line.startswith("flags")), [])
    except OSError:
        return []

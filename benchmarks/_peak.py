"""Run a module as __main__ and, at exit, write this process's peak RSS (VmHWM) to a file.

    python -m benchmarks._peak OUT.json MODULE [ARGS...]

Why not the parent's `os.wait4` rusage: on Linux a child's `ru_maxrss` keeps the high-water mark
of the process image it replaced at exec, i.e. the benchmark process's own RSS at fork time (the
kernel carries it over in `signal_struct.maxrss`). A child of a 1 GB benchmark then reports at
least 1 GB whatever it used. VmHWM in /proc/self/status belongs to the new image only.
"""

import atexit
import json
import runpy
import sys


def _write(path: str) -> None:
    status = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS", "VmPeak"):
                    status[key.lower() + "_kb"] = int(value.split()[0])
    except OSError:
        import resource

        status["ru_maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(path, "w") as f:
        json.dump(status, f)


if __name__ == "__main__":
    out, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    atexit.register(_write, out)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)

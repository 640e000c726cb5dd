"""Stress mode for every Python process of a test run (`make stress` puts this folder on PYTHONPATH).

Python imports `sitecustomize` at startup, before any other code, in every interpreter that sees this folder on
its path: pytest itself (and the servers it runs in-process) and every subprocess it starts with the inherited
environment (server processes, clients). Nothing happens unless SLOTSERVE_STRESS_SWITCH_INTERVAL is set, so the
folder is inert on a plain PYTHONPATH, and product code carries no test hook.

    SLOTSERVE_STRESS_SWITCH_INTERVAL  seconds for sys.setswitchinterval (e.g. 1e-6: the GIL changes hands as
                                      often as it can, so thread interleavings that are rare become common)
    SLOTSERVE_STRESS_RECORD           a folder: each process writes one file there (pid, interval, command
                                      line), so the runner can show that the servers under test ran stressed
"""

import os
import sys


def _stress() -> None:
    interval = os.environ.get("SLOTSERVE_STRESS_SWITCH_INTERVAL")
    if not interval:
        return
    sys.setswitchinterval(float(interval))
    record = os.environ.get("SLOTSERVE_STRESS_RECORD")
    if record:
        try:
            with open(os.path.join(record, f"{os.getpid()}.txt"), "w") as handle:
                handle.write(f"{sys.getswitchinterval()!r}\t{' '.join(sys.orig_argv)}\n")
        except OSError:  # a vanished record folder must not break the process under test
            pass


_stress()

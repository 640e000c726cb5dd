"""`make stress`'s switch-interval hook (tests/stress/site/sitecustomize.py) reaches a fresh interpreter through
the environment alone, records it, and is inert without its variable."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.stress import run as stress

PROBE = "import sys; print(repr(sys.getswitchinterval()))"


def _interval(environment: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True, check=True, timeout=60
    )
    return float(done.stdout)


def test_a_subprocess_of_a_stressed_environment_runs_with_the_interval_and_records_itself(tmp_path):
    environment = stress.stressed_environment(2e-6, tmp_path)
    assert _interval(environment) == 2e-6
    # and so does a process started by that process with an inherited environment (a server under a test)
    nested = (
        f"import subprocess, sys; print(subprocess.run([sys.executable, '-c', {PROBE!r}], "
        f"capture_output=True, text=True).stdout)"
    )
    done = subprocess.run(
        [sys.executable, "-c", nested], env=environment, capture_output=True, text=True, check=True, timeout=60
    )
    assert float(done.stdout) == 2e-6
    kinds = stress.processes_recorded(tmp_path, 2e-6)
    assert kinds == {"other": 3}


def test_the_site_folder_is_inert_without_its_variable():
    environment = {key: value for key, value in os.environ.items() if not key.startswith("SLOTSERVE_STRESS")}
    environment["PYTHONPATH"] = str(stress.SITE)
    assert _interval(environment) == 0.005  # CPython's default

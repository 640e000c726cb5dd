"""`make stress`: the concurrency-heavy tests, N times, on a starved machine with a hurried GIL.

    python -m tests.stress.run [--runs N] [--switch-interval S] [--hogs K] [PYTEST ARGS...]

Each run is one pytest process over SUITES (contract, shutdown, integration, admission). For the whole session:

* one CPU hog (a busy-looping process) per core this process may run on, so every test thread, server thread
  and server process competes for the CPU and is preempted at arbitrary points;
* `sys.setswitchinterval(S)` (default 1e-6 s) in every Python process of the run: pytest and the servers it
  runs in-process, and every server or client subprocess it starts. tests/stress/site/sitecustomize.py does it,
  reached through PYTHONPATH, so the product carries no test hook. It reaches every subprocess started with the
  inherited environment (all of the suites' server processes are, today); each such process leaves a record and
  the summary counts them per run, so a test that starts its servers with an environment of its own shows up
  as a drop in the server count.

A test that fails here is flaky, which is a bug: it orders events by timing somewhere. Runs continue after a
failure so one session shows every flaky test; the exit status is 1 if any run failed. Blocks until all runs
end; the hogs are killed on every exit path (and by the kernel if this process dies: PR_SET_PDEATHSIG), and an
interrupted run's whole process group with them. The runs import the working tree: leave it alone meanwhile.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parent / "site"
# The concurrency-heavy suites: the contract, shutdown and integration tests, and admission's threaded unit tests.
SUITES = [
    "tests/contract",
    "tests/shutdown",
    "tests/integration",
    "tests/unit/service/core/test_admission.py",
    "tests/unit/service/core/test_admission_controller.py",
    "tests/unit/service/core/test_admission_batching.py",
]
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the hog, before exec: the kernel kills it when the runner dies, however the runner dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_hogs(count: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            preexec_fn=_die_with_parent,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith("SLOTSERVE_STRESS")},
        )
        for _ in range(count)
    ]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def stressed_environment(switch_interval: float, record: Path) -> dict[str, str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), environment.get("PYTHONPATH")]))
    environment["SLOTSERVE_STRESS_SWITCH_INTERVAL"] = repr(switch_interval)
    environment["SLOTSERVE_STRESS_RECORD"] = str(record)
    return environment


def check_environment(environment: dict[str, str], switch_interval: float) -> None:
    """Fail early if a fresh interpreter with this environment does not get the switch interval."""
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; print(repr(sys.getswitchinterval()))"],
        env={**environment, "SLOTSERVE_STRESS_RECORD": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = float(probe.stdout.strip())
    if seen != switch_interval:
        raise SystemExit(
            f"stress setup broken: a fresh interpreter has switch interval {seen}, "
            f"expected {switch_interval} (is another sitecustomize ahead on the path?)"
        )


def failed_tests(junit: Path) -> list[str]:
    """Node ids of the failed or errored tests in a junit XML report."""
    if not junit.exists():
        return ["(pytest wrote no report: it crashed or was killed)"]
    failed = []
    for case in ElementTree.parse(junit).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return failed


def processes_recorded(record: Path, switch_interval: float) -> Counter:
    """How many Python processes of one run ran stressed, by kind; any with another interval is an error."""
    kinds: Counter = Counter()
    for path in record.glob("*.txt"):
        interval, _, command = path.read_text().rstrip("\n").partition("\t")
        if float(interval) != switch_interval:
            raise SystemExit(f"process {path.stem} ran with switch interval {interval}: {command}")
        if " -m pytest" in command:
            kinds["pytest"] += 1
        elif " -m service" in command or "slotserve" in command.split(" ", 1)[0]:
            kinds["server"] += 1
        else:
            kinds["other"] += 1
    return kinds


def run_once(
    index: int,
    runs: int,
    environment: dict[str, str],
    record: Path,
    pytest_args: list[str],
    switch_interval: float,
    work: Path,
) -> tuple[float, list[str], Counter]:
    for stale in record.glob("*.txt"):
        stale.unlink()
    junit = work / f"run{index}.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        *SUITES,
        *pytest_args,
    ]
    print(f"\n=== stress run {index}/{runs}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    # Its own process group, so an interrupted session also ends the server processes the tests started.
    pytest = subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True)
    try:
        code = pytest.wait()
    except BaseException:
        os.killpg(pytest.pid, signal.SIGKILL)
        pytest.wait()
        raise
    seconds = time.monotonic() - started
    failed = failed_tests(junit) if code else []
    if code and not failed:
        failed = [f"(pytest exited {code} with no failed test)"]
    return seconds, failed, processes_recorded(record, switch_interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=int(os.environ.get("STRESS_RUNS", "5")))
    parser.add_argument("--switch-interval", type=float, default=1e-6)
    parser.add_argument(
        "--hogs",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="busy-looping processes (default: one per usable core)",
    )
    options, pytest_args = parser.parse_known_args(argv)
    # SIGTERM (make interrupted, timeout(1)) unwinds like Ctrl-C, so the hogs are stopped in `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    with tempfile.TemporaryDirectory(prefix="slotserve-stress-") as temporary:
        work = Path(temporary)
        record = work / "processes"
        record.mkdir()
        environment = stressed_environment(options.switch_interval, record)
        check_environment(environment, options.switch_interval)
        hogs = start_hogs(options.hogs)
        try:
            for index in range(1, options.runs + 1):
                results.append(
                    run_once(index, options.runs, environment, record, pytest_args, options.switch_interval, work)
                )
        finally:
            stop_hogs(hogs)
    print(
        f"\n=== stress summary: {len(results)} runs of {' '.join(SUITES)}, {options.hogs} CPU hogs, "
        f"switch interval {options.switch_interval!r} s"
    )
    for index, (seconds, failed, kinds) in enumerate(results, 1):
        processes = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        print(f"run {index}: {'FAILED' if failed else 'passed'} in {seconds:.0f} s (stressed processes: {processes})")
        for name in failed:
            print(f"    failed: {name}")
    flaky = Counter(name for _, failed, _ in results for name in failed)
    print(
        f"{sum(1 for _, failed, _ in results if not failed)}/{len(results)} runs passed"
        + (f"; failing tests (runs failed): {dict(flaky)}" if flaky else "")
    )
    return 1 if flaky else 0


if __name__ == "__main__":
    sys.exit(main())

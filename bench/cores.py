"""`--cores N`: the CPUs the core-aware sections (transport, python, frontends) run on, and the front-end count
they size from N.

run.py pins its own process to the first N CPUs it may use around each of those sections, so every server,
python worker and perf_analyzer started in the section inherits the set; a machine with fewer CPUs than asked
skips them (and says so) rather than measuring something else under the same label.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

CORE_SECTIONS = ("transport", "python", "frontends")


def first_cpus(allowed: Iterable[int], cores: int | None) -> list[int] | None:
    """The first `cores` CPUs of `allowed`, in order (all of them when `cores` is None); None when `allowed` has
    fewer than `cores`. Raises ValueError for a count below 1."""
    cpus = sorted(allowed)
    if cores is None:
        return cpus
    if cores < 1:
        raise ValueError(f"--cores must be at least 1, not {cores}")
    return cpus[:cores] if len(cpus) >= cores else None


def frontends_for(cores: int) -> int:
    """The front-end count the frontends section measures beside N = 1 on `cores` CPUs: half of them, at least
    2 (the issue's N = 2 on a 2-core machine). The other half is left to the admission process, the python
    workers and the client. perf_analyzer opens one connection per 6 clients and SO_REUSEPORT spreads connections,
    not calls, so at 16 clients at most 3 front ends get work whatever N is."""
    return max(2, cores // 2)


@contextlib.contextmanager
def pinned(cpus: list[int]) -> Iterator[None]:
    """Pin this process to `cpus` for the block (children started inside inherit it); restore the set after."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)

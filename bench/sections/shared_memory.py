"""`identity_fp32` at 64 KiB, 1, 16 and 64 MiB, concurrency 1 and 4: MB/s with the input and the output in system
shared memory (perf_analyzer `--shared-memory system`) against the gRPC path, on one slotserve started with
`--shared-memory system`, alternating point by point; beside them, this machine's single-thread memcpy rate.

MB/s = request payload bytes per second (the output carries as many back). With shared memory the tensor is copied
three times: the server reads the input out of the client's object (`os.preadv` through its descriptor; it never
maps a region, see service/transport/shared_memory.py), ONNX Runtime's Identity writes its output, and the server writes
that into the output region (`os.pwrite`). So the rate is bound by how fast the machine copies memory; beside
memcpy the section measures those two kernel copies on a /dev/shm object of the same size, and names the page size
of /dev/shm (its `huge=` mount option): on 4 KiB pages the kernel looks up and copies every page on its own, at
about half the rate it reaches on 2 MiB pages (docs/speed.md#shared-memory).
"""

from __future__ import annotations

import _posixshmem
import os
import time

import numpy as np

from ..common import DEMO_REPOSITORY, log
from ..perf_analyzer import PerfAnalyzer, describe, measure_fp32_bytes
from ..servers import Launcher
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, median, met_if, ok, paired_ratio

SHM_SIZES = {"64 KiB": 16384, "1 MiB": 262144, "16 MiB": 4194304, "64 MiB": 16777216}  # FP32 elements
SHM_CONCURRENCY = (1, 4)
PATHS = ("shared memory", "gRPC")
TARGET = 5.0  # shared memory / gRPC at 16 MiB
# A window must hold a few requests: 64 MiB through gRPC takes about a second each at concurrency 4 here, and 16 MiB
# through gRPC as long when other jobs load the machine (a 2 s window then recorded no request at all).
LARGE_WINDOW_MS = 5000


def dev_shm_pages(mounts: str = "/proc/self/mounts") -> str:
    """How /dev/shm (where shm_open creates objects) allocates its pages: its `huge=` mount option ("never", the
    kernel's default, means 4 KiB pages), from the last /dev/shm line of `mounts` (the one on top)."""
    options = None
    try:
        with open(mounts) as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 4 and fields[1] == "/dev/shm":
                    options = fields[3].split(",")
    except OSError as error:
        return f"unknown ({error.strerror})"
    if options is None:
        return "not mounted"
    huge = [option for option in options if option.startswith("huge=")]
    return huge[0] if huge else "huge=never"


def _window_ms(pa: PerfAnalyzer, path: str, elements: int) -> int | None:
    large = elements >= SHM_SIZES["64 MiB"] or (path == "gRPC" and elements >= SHM_SIZES["16 MiB"])
    return max(pa.interval_ms, LARGE_WINDOW_MS) if large else None


def memcpy_mb_per_s(size: int = 64 << 20, repeats: int = 15) -> list[float]:
    """Single-thread copy rate between two warm (already faulted-in) buffers of `size` bytes, MB/s per repeat."""
    source = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in first
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        rates.append(size / (time.perf_counter() - started) / 1e6)
    return rates


def kernel_copy_mb_per_s(size: int = 64 << 20, repeats: int = 15) -> tuple[list[float], list[float]]:
    """Single-thread rates of what the server does with a region: `os.preadv` out of a /dev/shm object into a warm
    buffer, and `os.pwrite` from a warm buffer into the object (its pages already allocated), MB/s per repeat."""
    key = f"/slotserve_bench_{os.getpid()}"
    descriptor = _posixshmem.shm_open(key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        _posixshmem.shm_unlink(key)  # gone from /dev/shm at once; the descriptor keeps it until closed
        source = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        spare = np.empty(size + 4096, np.uint8)  # the target starts on a page, as the server places its reads
        target = spare[(-spare.ctypes.data) % 4096 :][:size]
        # (type: ignore: numpy types ndarray's __buffer__ from Python 3.12 on)
        os.pwrite(descriptor, source, 0)  # type: ignore[arg-type]  # allocate the object's pages first
        os.preadv(descriptor, [target], 0)  # type: ignore[list-item]  # and fault the buffer's in
        reads, writes = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            os.preadv(descriptor, [target], 0)  # type: ignore[list-item]
            reads.append(size / (time.perf_counter() - started) / 1e6)
            started = time.perf_counter()
            os.pwrite(descriptor, source, 0)  # type: ignore[arg-type]
            writes.append(size / (time.perf_counter() - started) / 1e6)
        return reads, writes
    finally:
        os.close(descriptor)


def _flags(path: str, elements: int) -> list[str]:
    if path == "gRPC":
        return []
    return ["--shared-memory", "system", "--output-shared-memory-size", str(elements * 4)]


def section_shared_memory(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    points: dict[tuple, list] = {(path, size, c): [] for path in PATHS for size in SHM_SIZES for c in SHM_CONCURRENCY}
    memcpy: list[float] = []
    preadv: list[float] = []
    pwrite: list[float] = []
    with launcher.slotserve("slotserve-shm", DEMO_REPOSITORY, ["--shared-memory", "system"]) as server:
        for round_index in range(args.rounds):
            memcpy += memcpy_mb_per_s()
            reads, writes = kernel_copy_mb_per_s()
            preadv += reads
            pwrite += writes
            log(
                f"shared memory round {round_index + 1}/{args.rounds}: memcpy {median(memcpy):.0f} MB/s, preadv "
                f"{median(preadv):.0f} MB/s, pwrite {median(pwrite):.0f} MB/s"
            )
            order = PATHS if round_index % 2 == 0 else PATHS[::-1]
            for size, elements in SHM_SIZES.items():
                for c in SHM_CONCURRENCY:
                    for path in order:
                        window = _window_ms(pa, path, elements)
                        point = measure_fp32_bytes(
                            pa, server, "identity_fp32", c, elements, _flags(path, elements), window
                        )
                        points[(path, size, c)].append(point)
                        log(
                            f"shared memory round {round_index + 1}/{args.rounds} {size} c={c} {path}: "
                            + (f"{point['mb_per_s']:.0f} MB/s, " if ok(point) else "")
                            + describe(point)
                        )
    raw["shared_memory"] = {f"{path} {size} c={c}": runs for (path, size, c), runs in points.items()}
    raw["memcpy_mb_per_s"] = memcpy
    raw["shm_preadv_mb_per_s"] = preadv
    raw["shm_pwrite_mb_per_s"] = pwrite
    ceiling = median(memcpy)
    pages = dev_shm_pages()
    raw["dev_shm_pages"] = pages
    table.add("shared_memory", "single-thread memcpy MB/s (64 MiB, warm): the ceiling", fmt(ceiling), mb_per_s=ceiling)
    table.add(
        "shared_memory",
        f"single-thread preadv / pwrite MB/s of a /dev/shm object (64 MiB, warm; /dev/shm {pages})",
        f"{fmt(median(preadv))} / {fmt(median(pwrite))}",
        preadv=median(preadv),
        pwrite=median(pwrite),
    )
    for size in SHM_SIZES:
        for c in SHM_CONCURRENCY:
            s, g = points[("shared memory", size, c)], points[("gRPC", size, c)]
            error = first_error(s) or first_error(g)
            ratio = paired_ratio(s, g, "mb_per_s")
            target = size == "16 MiB"
            shm_rate = column_median(s, "mb_per_s")
            table.add(
                "shared_memory",
                f"identity_fp32 {size} c={c} MB/s, shared memory / gRPC",
                f"{fmt(shm_rate)} / {fmt(column_median(g, 'mb_per_s'))} = {fmt_x(ratio)}"
                f" ({100 * shm_rate / ceiling:.0f} % of memcpy; p50 {fmt_ms(column_median(s, 'p50_ms'))} / "
                f"{fmt_ms(column_median(g, 'p50_ms'))} ms)" + (f" [{error[:100]}]" if error else ""),
                f"ratio >= {TARGET:g}" if target else "",
                met_if(ratio, lambda v: v >= TARGET) if target else None,
                ratio=ratio,
                shared_memory=shm_rate,
                grpc=column_median(g, "mb_per_s"),
            )

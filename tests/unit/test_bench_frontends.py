"""The frontends bench section's arithmetic and parsing (bench/sections/frontends.py, bench/cores.py,
bench/transport/accounting.py): the projected ceiling's formula, the /proc/PID/stat fields it reads, how a
server's processes are told apart, and --cores's CPU choice. Benchmarks print figures; these check the figures'
arithmetic, not any speed."""

from __future__ import annotations

import math
import os

import pytest

from bench.cores import first_cpus, frontends_for
from bench.sections.frontends import Point, _points, _rows, cpu_by_role, per_request_us, projected_ceiling, role_of
from bench.table import Table
from bench.transport.accounting import process_cpu_s, stat_cpu_ticks, tree_cpu_s


def test_the_ceiling_is_the_admission_process_alone_once_the_cores_carry_the_rest() -> None:
    # 200 us of admission CPU a request caps one GIL at 5,000/s; 1,000 us of tree CPU caps 4 cores at 4,000/s.
    assert projected_ceiling(200.0, 1000.0, 4) == pytest.approx(4000.0)
    assert projected_ceiling(200.0, 1000.0, 8) == pytest.approx(5000.0)
    assert projected_ceiling(200.0, 1000.0, 32) == pytest.approx(5000.0)


def test_the_issue_goal_of_120_us_puts_the_ceiling_near_8300_a_second() -> None:
    assert projected_ceiling(120.0, 300.0, 32) == pytest.approx(1e6 / 120)


@pytest.mark.parametrize(
    ("admission", "tree"), [(float("nan"), 100.0), (100.0, float("nan")), (0.0, 100.0), (100.0, -1.0), (math.inf, 1.0)]
)
def test_a_missing_or_meaningless_figure_projects_nothing(admission: float, tree: float) -> None:
    assert math.isnan(projected_ceiling(admission, tree, 4))


def test_cpu_ticks_are_read_past_a_command_name_with_spaces_and_parentheses() -> None:
    # fields 3.. after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    line = "4242 (a) b (c d) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 5 0 99 0 0\n"
    assert stat_cpu_ticks(line) == 1234 + 567


def test_this_process_cpu_is_read_from_proc() -> None:
    spent = process_cpu_s(os.getpid())
    assert spent > 0
    assert os.getpid() in tree_cpu_s(os.getpid())


@pytest.mark.parametrize(
    ("pid", "command_line", "role"),
    [
        (10, "/venv/bin/python -m service --model-repository /m --port 0", "admission"),
        (11, "/venv/bin/python -m service.frontends.process --index 1", "front ends"),
        (12, "/venv/bin/python -m engine.python.worker 7 10", "python workers"),
        (13, "/opt/tritonserver/backends/python/triton_python_backend_stub /m/model.py", "python workers"),
        (13, "/t/backends/python/triton_python_backend_stub /tmp/frontends/model.py", "python workers"),
        (12, "/venv/bin/python -m engine.python.worker 7 10 /frontends", "python workers"),
        (14, "/bin/sh -c something", "other"),
    ],
)
def test_a_server_tree_is_split_by_role(pid: int, command_line: str, role: str) -> None:
    assert role_of(pid, 10, command_line) == role


def test_cpu_by_role_counts_a_process_that_started_during_the_run_from_zero() -> None:
    before = {10: ("python -m service", 1.0), 12: ("python -m engine.python.worker 7 10", 0.5)}
    after = {
        10: ("python -m service", 1.25),
        12: ("python -m engine.python.worker 7 10", 0.75),
        20: ("python -m service.frontends.process", 0.5),  # a front end replaced during the run
    }
    spent = cpu_by_role(10, before, after)
    assert spent == pytest.approx({"admission": 0.25, "front ends": 0.5, "python workers": 0.25, "other": 0.0})


def test_per_request_figures_divide_by_the_requests_counted() -> None:
    spent = {"admission": 0.1, "front ends": 0.2, "python workers": 0.1, "other": 0.0}
    figures = per_request_us(spent, 1000)
    assert figures["admission_us"] == pytest.approx(100.0)
    assert figures["tree_us"] == pytest.approx(400.0)
    assert figures["front_ends_us"] == pytest.approx(200.0)
    assert figures["workers_us"] == pytest.approx(100.0)
    assert figures["front_end_share"] == pytest.approx(0.5)
    assert figures["other_us"] == 0.0
    assert per_request_us(spent, 0) == {}


def test_cores_takes_the_first_cpus_or_none_when_the_machine_has_fewer() -> None:
    assert first_cpus({3, 1, 2, 0}, 2) == [0, 1]
    assert first_cpus({3, 1}, None) == [1, 3]
    assert first_cpus({0, 1}, 2) == [0, 1]
    assert first_cpus({0, 1}, 16) is None
    with pytest.raises(ValueError, match="at least 1"):
        first_cpus({0, 1}, 0)


def test_front_ends_are_half_the_cores_and_at_least_two() -> None:
    assert [frontends_for(cores) for cores in (1, 2, 4, 8, 16)] == [2, 2, 2, 4, 8]


def _fake_points(names: list[str]) -> dict[Point, list[dict]]:
    """Two rounds of every point the section measures: N=2 serves 1.1x N=1's rate, gil_2 1.6x gil_1's."""
    points: dict[Point, list[dict]] = {}
    for point in _points(names):
        rate = 1000.0 * (1.1 if point.server == "N=2" else 1.0) * (1.6 if point.model == "gil_2" else 1.0)
        cpu = {"admission_us": 100.0 if point.server == "N=2" else 600.0, "tree_us": 700.0, "front_end_share": 0.5}
        points[point] = [{"infer_per_s": rate, "p50_ms": 1.0, "p99_ms": 2.0, **cpu} for _ in range(2)]
    return points


def test_the_rows_give_n_over_one_the_gil_scaling_and_the_projection() -> None:
    names = ["N=1", "N=2", "triton"]
    table = Table()
    setup = {"cores": 2, "slotserve_commit": "abc", "slotserve_root": "/x", "load_start": [1.0], "load_end": [2.0]}
    _rows(table, setup, _fake_points(names), names, "N=2")
    rows = {row["figure"]: row for row in table.rows}
    n_over_one = rows["frontends simple c=16: N=2 / N=1 infer/s (median of per-round ratios)"]
    assert n_over_one["ratio"] == pytest.approx(1.1)
    assert n_over_one["met"] is True
    assert n_over_one["value"] == "1.10x (wins by 10 %)"
    gil = rows["frontends GIL-holding model.py c=4 N=2: 2 slots / 1 slot"]
    assert gil["ratio"] == pytest.approx(1.6)
    assert gil["met"] is True
    admission = rows["frontends simple c=16 N=2: the admission process's CPU per request"]
    assert admission["met"] is True  # 100 us <= 120
    projection = rows["frontends PROJECTED ceiling simple N=2 (from c=16: admission 100 us, tree 700 us)"]
    assert projection["projected"]["4"] == pytest.approx(4e6 / 700)
    assert projection["projected"]["32"] == pytest.approx(1e6 / 100)
    assert not any("triton" in figure and "PROJECTED" in figure for figure in rows)


def test_without_frontends_the_rows_say_n_was_not_measured() -> None:
    names = ["N=1", "triton"]
    table = Table()
    setup = {"cores": 2, "slotserve_commit": "abc", "slotserve_root": "/x", "load_start": [1.0], "load_end": [2.0]}
    setup["n_missing"] = "no --frontends"
    _rows(table, setup, _fake_points(names), names, "N=2")
    rows = {row["figure"]: row for row in table.rows}
    assert rows["frontends simple c=16: N=2 / N=1"]["value"] == "not measured (no --frontends)"
    assert rows["frontends simple c=16 N=1: the admission process's CPU per request"]["met"] is False  # 600 us

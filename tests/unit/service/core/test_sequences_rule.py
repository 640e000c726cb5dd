"""The sequence rule (service/core/sequences.py) on its own: seeded random schedules of several sequences over a
few slots, run by real threads, checked against what the rule promises: a sequence's requests run in their
arrival order, one at a time, always on the slot its start took; no two open sequences share a slot; every slot
comes back (END, idle, a start that gives up, a failed request). Plus the flag parsing, the filled inputs and the
idle expiry on an injected clock."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from engine.config.specs import SequenceControl, SequenceSpec, SequenceState
from engine.errors import RequestRescheduled
from engine.interface import CancelToken
from service.core.errors import AdmissionTimeout, RequestCancelled
from service.core.sequences import (
    AssignedId,
    SequenceFlags,
    SequenceIdRequired,
    SequenceNotStarted,
    SequenceParameterError,
    SequenceTable,
    read_flags,
)
from service.core.sequences import _corrid as corrid

SPEC = SequenceSpec(max_idle_us=60_000_000)
# The random schedules' sequences go idle after 0.2 s: one whose END gave up holds its slot until then, and a start
# waiting for that slot wakes at that expiry and takes it (on a slow machine a sequence may expire between its own
# requests: those are refused, which the properties allow).
SCHEDULE_SPEC = SequenceSpec(max_idle_us=200_000)
WAIT = 30.0


class Recorder:
    """What ran: per sequence, (arrival number, slot) in run order; and checks made while each turn runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards: runs, running_slots, violations
        self.runs: dict[int, list[tuple[int, int]]] = {}
        self.running_slots: dict[int, int] = {}  # slot -> sequence running on it now
        self.violations: list[str] = []

    def run(self, sequence_id: int, number: int, slot: int, table: SequenceTable) -> None:
        with self.lock:
            other = self.running_slots.get(slot)
            if other is not None:
                self.violations.append(f"slot {slot}: sequence {sequence_id} ran while {other} ran there")
            self.running_slots[slot] = sequence_id
            self.runs.setdefault(sequence_id, []).append((number, slot))
        stats = table.statistics()
        if len(set(stats.slots_in_use)) != len(stats.slots_in_use):
            with self.lock:
                self.violations.append(f"two open sequences share a slot: {stats.slots_in_use}")
        time.sleep(0)  # ordering-free: a yield so other threads interleave here
        with self.lock:
            del self.running_slots[slot]


def drive(seed: int) -> tuple[SequenceTable, Recorder, dict[int, list[tuple[int, int]]], int]:
    """One random schedule: 1-3 slots, 2-6 sequences of 1-5 requests each, submitted from one thread per
    request in a shuffled order (a sequence's start is submitted first); some requests fail, some give up."""
    rng = random.Random(seed)
    capacity = rng.randint(1, 3)
    table = SequenceTable("m")
    recorder = Recorder()
    sequences = {sid: rng.randint(1, 5) for sid in range(1, rng.randint(2, 6) + 1)}
    arrivals: dict[int, list[tuple[int, int]]] = {}  # sequence -> (arrival number, slot) of each turn it got
    refused = [0]
    lock = threading.Lock()  # guards: arrivals, refused

    def request(sid: int, index: int, count: int) -> None:
        flags = SequenceFlags(sid, start=index == 0, end=index == count - 1)
        gives_up = rng_choices[(sid, index)] == "gives_up"
        deadline = time.monotonic() + (0.001 if gives_up else WAIT)
        try:
            turn = table.enter(flags, SCHEDULE_SPEC, capacity, deadline, CancelToken())
        except (SequenceNotStarted, AdmissionTimeout):
            with lock:
                refused[0] += 1
            return
        try:
            with lock:
                arrivals.setdefault(sid, []).append((turn.number, turn.slot))
            if rng_choices[(sid, index)] != "fails":
                recorder.run(sid, turn.number, turn.slot, table)
        finally:
            table.finish(turn)

    rng_choices = {
        (sid, index): rng.choice(["runs", "runs", "runs", "fails", "gives_up"])
        for sid, count in sequences.items()
        for index in range(count)
    }
    starts = [threading.Thread(target=request, args=(sid, 0, count)) for sid, count in sequences.items()]
    rest = [
        threading.Thread(target=request, args=(sid, index, count))
        for sid, count in sequences.items()
        for index in range(1, count)
    ]
    rng.shuffle(rest)
    for thread in starts:
        thread.start()
    for thread in rest:
        thread.start()
    for thread in starts + rest:
        thread.join(WAIT)
        assert not thread.is_alive(), f"seed {seed}: a request never returned"
    return table, recorder, arrivals, refused[0]


@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_keep_order_and_slot_and_leak_nothing(seed):
    table, recorder, arrivals, _ = drive(seed)
    assert not recorder.violations, (seed, recorder.violations)
    for sid, runs in recorder.runs.items():
        numbers = [number for number, _ in runs]
        assert numbers == sorted(numbers), f"seed {seed}: sequence {sid} ran out of arrival order: {numbers}"
    for sid, turns in arrivals.items():
        # Between two starts a sequence stays on one slot; a new start (after an END) may take another.
        assert all(0 <= slot < 3 for _, slot in turns), (seed, sid, turns)
    stats = table.statistics()
    # Every sequence ended (its END ran, failed or gave up: an END that gives up before its turn leaves the
    # sequence open until its idle timeout, which the test then expires); nothing holds a slot afterwards.
    table.sweep(SequenceSpec(max_idle_us=1))
    after = table.statistics()
    assert after.open == 0 and after.waiting_starts == 0 and after.running == 0, (seed, stats, after)
    assert after.slots_in_use == ()


def test_a_sequence_never_changes_slot_between_its_start_and_its_end():
    table = SequenceTable("m")
    slots: dict[int, set[int]] = {1: set(), 2: set(), 3: set()}
    for step in range(5):
        for sid in slots:
            turn = table.enter(SequenceFlags(sid, start=step == 0, end=step == 4), SPEC, 3, None)
            slots[sid].add(turn.slot)
            table.finish(turn)
    assert all(len(used) == 1 for used in slots.values()) and len(set().union(*slots.values())) == 3
    assert table.statistics().open == 0


def test_direct_slots_spread_over_instances_and_a_sequence_keeps_its_instance():
    """Four sequence slots over two instances (max_batch_size 2 x 2, as Triton's direct): four sequences are open
    at once, two per instance, each on one instance from its start to its end; a freed slot goes to the
    instance with the fewest open sequences."""
    table = SequenceTable("m")
    contexts: dict[int, set[int]] = {sid: set() for sid in (1, 2, 3, 4)}
    for step in range(3):
        for sid in contexts:
            turn = table.enter(SequenceFlags(sid, start=step == 0, end=step == 2 and sid == 1), SPEC, 4, None, None, 2)
            contexts[sid].add(turn.context)
            table.finish(turn)
    assert all(len(used) == 1 for used in contexts.values()), contexts
    assert sorted(next(iter(used)) for used in contexts.values()) == [0, 0, 1, 1]
    freed = next(iter(contexts[1]))  # sequence 1 ended: its instance runs one sequence now
    turn = table.enter(SequenceFlags(5, start=True), SPEC, 4, None, None, 2)
    assert turn.context == freed
    table.finish(turn)
    assert table.statistics().open == 4


def test_pending_counts_starts_waiting_for_a_slot_and_queued_turns():
    table = SequenceTable("m")
    holder = table.enter(SequenceFlags(1, start=True), SPEC, 1, None)
    assert table.pending_count() == 0  # the running turn is not pending

    def waiting_start() -> None:
        table.finish(table.enter(SequenceFlags(2, start=True, end=True), SPEC, 1, time.monotonic() + WAIT))

    thread = threading.Thread(target=waiting_start)
    thread.start()
    deadline = time.monotonic() + WAIT
    while table.pending_count() != 1:  # polls an observable state until a deadline
        assert time.monotonic() < deadline and thread.is_alive(), table.statistics()
        time.sleep(0.01)  # ordering-free: polls pending_count() until a deadline
    table.finish(holder)
    table.finish(table.enter(SequenceFlags(1, end=True), SPEC, 1, None))
    thread.join(WAIT)
    assert not thread.is_alive() and table.pending_count() == 0


def test_a_start_waits_fifo_for_a_slot_and_gets_the_one_an_end_frees():
    table = SequenceTable("m")
    first = table.enter(SequenceFlags(1, start=True), SPEC, 1, None)
    table.finish(first)
    order: list[int] = []

    def start(sid: int) -> None:
        turn = table.enter(SequenceFlags(sid, start=True, end=True), SPEC, 1, time.monotonic() + WAIT)
        order.append(sid)
        table.finish(turn)

    waiters = []
    for sid in (2, 3):
        waiters.append(threading.Thread(target=start, args=(sid,)))
        waiters[-1].start()
        deadline = time.monotonic() + WAIT
        while table.statistics().waiting_starts < sid - 1:  # polls an observable state until a deadline
            assert time.monotonic() < deadline
            time.sleep(0.001)  # ordering-free: re-checks an observable state until a deadline
    end = table.enter(SequenceFlags(1, end=True), SPEC, 1, None)
    table.finish(end)
    for thread in waiters:
        thread.join(WAIT)
    assert order == [2, 3]
    assert table.statistics().open == 0


def test_a_start_that_times_out_waiting_names_the_slots_and_holds_nothing():
    table = SequenceTable("m")
    table.finish(table.enter(SequenceFlags(1, start=True), SPEC, 1, None))
    with pytest.raises(AdmissionTimeout, match="no free sequence slot for sequence 2 .*1 sequence slot, all held"):
        table.enter(SequenceFlags(2, start=True), SPEC, 1, time.monotonic() + 0.01)
    cancel = CancelToken()
    cancel.cancel("test")
    with pytest.raises(RequestCancelled):
        table.enter(SequenceFlags(3, start=True), SPEC, 1, None, cancel)
    stats = table.statistics()
    assert stats.open == 1 and stats.waiting_starts == 0 and stats.slots_in_use == (0,)


def test_idle_sequences_end_on_the_injected_clock_and_their_next_request_is_told():
    now = [100.0]
    table = SequenceTable("m", clock=lambda: now[0])
    spec = SequenceSpec(max_idle_us=2_000_000)
    table.finish(table.enter(SequenceFlags(7, start=True), spec, 2, None))
    now[0] += 1.9
    table.finish(table.enter(SequenceFlags(7), spec, 2, None))  # activity restarts its idle time
    now[0] += 1.9
    assert table.sweep(spec) == 0
    now[0] += 0.2
    assert table.sweep(spec) == 1 and table.statistics().idle_ended == 1
    with pytest.raises(SequenceNotStarted, match="sequence 7 .*idle for more than 2000000 microseconds"):
        table.enter(SequenceFlags(7), spec, 2, None)
    with pytest.raises(SequenceNotStarted, match="sequence 8 .*must specify the START flag"):
        table.enter(SequenceFlags(8), spec, 2, None)


def test_end_all_ends_open_sequences_and_hands_their_slots_to_waiting_starts():
    table = SequenceTable("m")
    table.finish(table.enter(SequenceFlags(1, start=True), SPEC, 1, None))
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(table.enter(SequenceFlags(2, start=True), SPEC, 1, time.monotonic() + WAIT).slot)
    )
    waiter.start()
    deadline = time.monotonic() + WAIT
    while table.statistics().waiting_starts < 1:  # polls an observable state until a deadline
        assert time.monotonic() < deadline
        time.sleep(0.001)  # ordering-free: re-checks an observable state until a deadline
    assert table.end_all("its model was unloaded") == 1
    waiter.join(WAIT)
    assert got == [0]
    with pytest.raises(SequenceNotStarted, match="sequence 1 .*because its model was unloaded"):
        table.enter(SequenceFlags(1), SPEC, 1, None)


def test_flags_are_read_with_their_types_checked():
    assert read_flags("m", {"sequence_id": ("uint64_param", 2**64 - 1)}) == SequenceFlags(2**64 - 1)
    assert read_flags(
        "m", {"sequence_id": ("string_param", "a"), "sequence_start": ("bool_param", True)}
    ) == SequenceFlags("a", start=True)
    with pytest.raises(SequenceIdRequired, match="model 'm' must specify a non-zero or non-empty correlation ID"):
        read_flags("m", {"sequence_start": ("bool_param", True)})
    with pytest.raises(SequenceIdRequired):
        read_flags("m", {"sequence_id": ("string_param", "")})
    with pytest.raises(SequenceParameterError, match="value type for 'sequence_id' parameter, expected int64_param"):
        read_flags("m", {"sequence_id": ("double_param", 1.0)})
    # A number is its 64-bit value, as Triton reads an int64 id (its messages name 18446744073709551613).
    assert read_flags("m", {"sequence_id": ("int64_param", -3)}) == SequenceFlags(2**64 - 3)
    with pytest.raises(SequenceParameterError, match="'sequence_start' parameter, expected bool_param .got int64"):
        read_flags("m", {"sequence_id": ("int64_param", 1), "sequence_start": ("int64_param", 1)})


def test_control_and_state_inputs_are_filled_per_turn():
    spec = SequenceSpec(
        controls=(
            SequenceControl("start", "S", "INT32", 0, 1),
            SequenceControl("end", "E", "FP32", -1.0, 2.5),
            SequenceControl("ready", "R", "BOOL", False, True),
            SequenceControl("corrid", "C", "UINT32"),
        ),
        states=(SequenceState("SI", "SO", "FP32", (2,), (2,), np.array([1, 2], "<f4").tobytes()),),
    )
    table = SequenceTable("m")
    turn = table.enter(SequenceFlags(9, start=True), spec, 1, None)
    table.bind(turn, pool="p")
    filled = table.inputs(turn, spec, batched=True)
    assert {k: v.tolist() for k, v in filled.items()} == {
        "S": [[1]],
        "E": [[-1.0]],
        "R": [[True]],
        "C": [[9]],
        "SI": [[1.0, 2.0]],
    }
    assert filled["C"].dtype == np.uint32 and filled["SI"].shape == (1, 2)
    answer = table.keep_states(turn, spec, {"OUT": np.ones(1), "SO": np.array([[5.0, 6.0]], np.float32)})
    assert list(answer) == ["OUT"]
    table.finish(turn)
    last = table.enter(SequenceFlags(9, end=True), spec, 1, None)
    table.bind(last, pool="p")
    filled = table.inputs(last, spec, batched=True)
    assert filled["S"].tolist() == [[0]] and filled["E"].tolist() == [[2.5]] and filled["SI"].tolist() == [[5, 6]]
    table.finish(last)
    negative = table.enter(SequenceFlags(-3, start=True, end=True), spec, 1, None)
    assert table.inputs(negative, spec, batched=False)["C"].tolist() == [2**32 - 3]  # as Triton reinterprets it
    table.finish(negative)
    with pytest.raises(SequenceParameterError, match="'x' is a string; the model's CORRID control input is UINT32"):
        string = table.enter(SequenceFlags("x", start=True), spec, 1, None)
        try:
            table.inputs(string, spec, batched=False)
        finally:
            table.finish(string)


def test_a_turn_on_another_pool_ends_its_sequence():
    table = SequenceTable("m")
    turn = table.enter(SequenceFlags(1, start=True), SPEC, 1, None)
    table.bind(turn, pool="old")
    table.finish(turn)
    again = table.enter(SequenceFlags(1), SPEC, 1, None)
    with pytest.raises(SequenceNotStarted, match="its model was reloaded or reconfigured"):
        table.bind(again, pool="new")
    table.finish(again)
    assert table.statistics().open == 0


# ---- ids: one sequence per 64-bit value -----------------------------------------------------------------------


def test_an_int64_id_and_the_uint64_of_its_bits_name_one_sequence():
    """int64 -1 and uint64 2**64-1 (issue 33): one sequence, one slot, one CORRID value in every numeric type."""
    as_int64 = read_flags("m", {"sequence_id": ("int64_param", -1), "sequence_start": ("bool_param", True)})
    as_uint64 = read_flags("m", {"sequence_id": ("uint64_param", 2**64 - 1), "sequence_end": ("bool_param", True)})
    assert as_int64.id == as_uint64.id == 2**64 - 1
    table = SequenceTable("m")
    table.finish(table.enter(as_int64, SPEC, 2, None))
    assert table.statistics().open == 1
    end = table.enter(as_uint64, SPEC, 2, None)  # the same sequence: no START needed, no second slot
    assert table.statistics().slots_in_use == (end.slot,)
    table.finish(end)
    assert table.statistics().open == 0


@pytest.mark.parametrize(
    "datatype, expected",
    [("UINT64", 2**64 - 1), ("INT64", -1), ("UINT32", 2**32 - 1), ("INT32", -1)],
)
def test_both_spellings_of_an_id_fill_corrid_alike(datatype, expected):
    for kind, value in (("int64_param", -1), ("uint64_param", 2**64 - 1)):
        key = read_flags("m", {"sequence_id": (kind, value)}).id
        assert corrid(datatype, key, (1,)).tolist() == [expected], (kind, datatype)


@pytest.mark.parametrize("kind, value", [("int64_param", -(2**40)), ("uint64_param", 2**64 - 2**40)])
def test_an_id_a_32_bit_corrid_cannot_hold_is_refused_alike_in_both_spellings(kind, value):
    key = read_flags("m", {"sequence_id": (kind, value)}).id
    with pytest.raises(SequenceParameterError, match=f"sequence id {2**64 - 2**40} does not fit .*UINT32"):
        corrid("UINT32", key, (1,))


# ---- iterative sequences --------------------------------------------------------------------------------------

ITERATIVE = SequenceSpec(max_idle_us=60_000_000, iterative=True)
CONTROLS = SequenceSpec(
    max_idle_us=60_000_000,
    iterative=True,
    controls=(
        SequenceControl("start", "S", "INT32", 0, 1),
        SequenceControl("end", "E", "INT32", 0, 1),
        SequenceControl("corrid", "C", "UINT64"),
    ),
)


def test_an_iterative_request_without_an_id_gets_one_of_its_own_and_starts():
    assert read_flags("m", {}, iterative=True) == SequenceFlags(0)
    with pytest.raises(SequenceIdRequired):
        read_flags("m", {})
    table = SequenceTable("m")
    first = table.assign(SequenceFlags(0, end=True))
    assert first == SequenceFlags(AssignedId(1), start=True, end=False)  # Triton sets START alone
    assert table.assign(SequenceFlags("")).id == AssignedId(2)
    assert AssignedId(1) != 1  # never a client's sequence 1
    turn = table.enter(first, CONTROLS, 2, None)
    client = table.enter(SequenceFlags(1, start=True), CONTROLS, 2, None)
    assert table.statistics().open == 2
    filled = table.inputs(turn, CONTROLS, batched=False)
    assert {name: array.tolist() for name, array in filled.items()} == {"S": [1], "E": [0], "C": [1]}
    assert table.shown_to_model(turn, None).correlation_id == 1 and table.shown_to_model(turn, None).flags == 1
    table.finish(client)
    table.finish(turn)


def test_a_rescheduled_request_runs_again_after_the_ones_queued_before_it_with_start_and_end_false():
    table = SequenceTable("m")
    turn = table.enter(SequenceFlags(7, start=True, end=True), CONTROLS, 1, None)
    table.bind(turn, pool="p")
    assert {k: v.tolist() for k, v in table.inputs(turn, CONTROLS, batched=True).items()} == {
        "S": [[1]],
        "E": [[1]],
        "C": [[7]],
    }
    later: list = []
    queued = threading.Thread(target=lambda: later.append(table.enter(SequenceFlags(7), CONTROLS, 1, None)))
    queued.start()
    deadline = time.monotonic() + WAIT
    while table.statistics().queued_turns != 1:  # the later request waits for its turn
        assert time.monotonic() < deadline, table.statistics()
        time.sleep(0.001)  # ordering-free: polls an observable state until a deadline
    rescheduled = threading.Thread(target=table.again, args=(turn, CONTROLS, time.monotonic() + WAIT))
    rescheduled.start()
    queued.join(WAIT)
    assert later and table.statistics().running == 1  # the later request runs first; the rescheduled one waits
    assert rescheduled.is_alive()
    table.finish(later[0])
    rescheduled.join(WAIT)
    assert not rescheduled.is_alive()
    assert turn.executions == 1 and table.statistics().running == 1
    filled = table.inputs(turn, CONTROLS, batched=True)
    assert filled["S"].tolist() == [[0]] and filled["E"].tolist() == [[0]] and filled["C"].tolist() == [[7]]
    assert table.shown_to_model(turn, None).flags == 0
    table.finish(turn)  # its END, on its last execution: the sequence ends now
    with pytest.raises(SequenceNotStarted, match="because its END request was served"):
        table.enter(SequenceFlags(7), CONTROLS, 1, None)


def test_the_request_that_started_an_iterative_sequence_ends_it_when_it_finishes():
    table = SequenceTable("m")
    turn = table.enter(SequenceFlags(3, start=True), ITERATIVE, 1, None)
    table.again(turn, ITERATIVE, None)  # rescheduled: the sequence stays open, its slot held
    assert table.statistics().open == 1
    table.finish(turn)
    assert table.statistics().open == 0
    with pytest.raises(SequenceNotStarted, match="the request that started it finished"):
        table.enter(SequenceFlags(3), ITERATIVE, 1, None)
    plain = table.enter(SequenceFlags(4, start=True), SPEC, 1, None)  # without iterative_sequence: stays open
    table.finish(plain)
    assert table.statistics().open == 1


def test_a_rescheduled_request_of_a_sequence_ended_meanwhile_is_refused_and_leaks_nothing():
    table = SequenceTable("m")
    turn = table.enter(SequenceFlags(5, start=True), ITERATIVE, 1, None)
    table.end_all("its model was unloaded")
    with pytest.raises(SequenceNotStarted, match="its model was unloaded"):
        table.again(turn, ITERATIVE, None)
    table.finish(turn)
    stats = table.statistics()
    assert stats.open == 0 and stats.running == 0 and stats.queued_turns == 0
    assert RequestRescheduled.error_reason is None  # never a client's answer: the generic INTERNAL if it escaped


def test_a_request_rescheduled_past_its_deadline_stops_there_and_leaks_nothing():
    clock = [100.0]
    table = SequenceTable("m", clock=lambda: clock[0])
    turn = table.enter(SequenceFlags(6, start=True), ITERATIVE, 1, 101.0)
    table.again(turn, ITERATIVE, 101.0)  # within its deadline: runs again at once (nothing else queued)
    clock[0] = 101.0
    with pytest.raises(AdmissionTimeout, match="sequence 6's request was rescheduled by its model 2 times and its"):
        table.again(turn, ITERATIVE, 101.0)
    table.finish(turn)
    stats = table.statistics()
    assert stats.open == 0 and stats.running == 0 and stats.queued_turns == 0

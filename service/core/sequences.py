"""Sequences (config.pbtxt `sequence_batching`, the direct strategy): every request of one sequence runs on one
slot, in arrival order, with the control inputs and the implicit state the model's configuration declares.

The rule (contract SEQUENCE.nn, docs/sequences.md):

* A model has `ModelEntry.sequence_capacity()` **sequence slots**: `direct`, as Triton's, has max(1,
  max_batch_size) of them per instance (slot); `oldest` has max_candidate_sequences per slot. A request with
  `sequence_start` takes one for its sequence, in FIFO order among the starts that wait for one, until the
  request's admission deadline. The sequence keeps that slot until a request with `sequence_end` ends it; under
  `direct` each of its requests runs on the slot's instance (context `slot % instances`, fixed when the slot is
  handed), so a python model may keep per-sequence state in its worker.
* The requests of a sequence take their **turns** in arrival order: one runs at a time, the next waits until
  the previous one is done (never reordered, never on another instance). Each turn then goes through the model's
  ordinary admission (`ModelEntry.acquire_lease` for the sequence's context), so a queued manager is waited
  for as any request waits for it, and a manager waits only for the turn that runs, not for open sequences.
  Turns of different sequences pinned to one instance run one after another (each alone, not as one batch).
* An open sequence with no request for `max_sequence_idle_microseconds` is ended and its slot handed on; its
  next request is refused naming that. A sequence whose model was reconfigured, unloaded, evicted or closed
  at shutdown (`end_all`, called when its pool is retired) is ended the same way. An ended id is remembered
  (the last ENDED_MEMORY of them) so that its next request is told why, not just that it never started.
* Implicit state is kept per sequence here: the initial state at START, then each successful run's state
  output, fed back as the state input of the next turn. A failed run leaves the state as it was.
* Ids: a number names its sequence by its 64-bit value (int64 -1 and uint64 2**64-1 are one sequence, as Triton
  reads an int64 id as uint64); a string by itself.
* Iterative sequences (`iterative_sequence: true`, Triton's request rescheduling): a request without an id gets
  one of its own (AssignedId, numbered 1, 2, ... per model as Triton's) and starts a sequence; a turn whose engine
  raises RequestRescheduled (its model released it with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) goes back to the
  end of its sequence's queue (`SequenceTable.again`) and runs again, the same request with the same inputs,
  through the model's admission again, so other requests run between its executions (Triton re-enqueues it in
  its sequence batcher); executions after its first see START and END false; the request that started an
  iterative sequence ends it when it finishes (Triton releases the sequence slot then).
* A streaming (decoupled) model's answers are yielded as it sends them, its request holding its turn and its slot
  until the last (`sequence_answers`); a rescheduled one releases its slot between executions.

States of a sequence, and their transitions:

    WAITING -> OPEN     a sequence slot was handed to its start
    WAITING -> ENDED    its start gave up (deadline, cancel) before it had a slot
    OPEN    -> ENDED    its END request finished (either way), an iterative sequence's START request finished, it
                        was idle too long, or its model's pool retired

Locking: `SequenceTable._lock` guards the table and every sequence's fields. It is a leaf: the model lock may be
held when it is taken (`end_all`, `open_count`), never the reverse; it is never held across a wait or a run.
A waiting request blocks on its own event.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from engine import datatypes
from engine.config.specs import CORRID, END, READY, START, SequenceSpec
from engine.errors import ModelError
from engine.interface import CancelToken, RequestInfo

from .errors import AdmissionTimeout, InvalidRequest, RequestCancelled

if TYPE_CHECKING:
    pass

ENDED_MEMORY = 4096  # ended sequence ids remembered for a clear refusal of their next request
ID_MODULUS = 2**64  # a numeric sequence id is its 64-bit value: int64 -1 is 2**64 - 1, as Triton reads it
START_FLAG, END_FLAG = 1, 2  # Triton's request flags, as a python model's request.flags() shows them


@dataclass(frozen=True)
class AssignedId:
    """The id an iterative sequence's request without one gets (Triton's iterative sequencer numbers them 1, 2, ...
    per model): a key of its own, so that it never meets a client's sequence of the same number."""

    number: int

    def __str__(self) -> str:
        return str(self.number)


SequenceId = int | str | AssignedId


class SequenceIdRequired(InvalidRequest):
    """A request of a sequence model without a (non-zero) sequence id."""


class SequenceNotStarted(InvalidRequest):
    """A request for a sequence that was never started, or already ended (the message says which)."""


class SequenceParameterError(InvalidRequest):
    """A sequence parameter of the wrong type, or a sequence id the model's CORRID cannot hold."""


class SequencePhase(enum.Enum):
    WAITING = "waiting"
    OPEN = "open"
    ENDED = "ended"


_TRANSITIONS = {
    SequencePhase.WAITING: frozenset({SequencePhase.OPEN, SequencePhase.ENDED}),
    SequencePhase.OPEN: frozenset({SequencePhase.ENDED}),
    SequencePhase.ENDED: frozenset(),
}


@dataclass(frozen=True)
class SequenceFlags:
    """A request's sequence parameters: its id (0 or "": none), and whether it starts or ends its sequence."""

    id: SequenceId = 0
    start: bool = False
    end: bool = False


def read_flags(model: str, parameters: Mapping[str, tuple[str, object]], iterative: bool = False) -> SequenceFlags:
    """The sequence flags of a request to a sequence model, from its parameters as the transport read them
    ({name: (kind, value)}, kind the protocol's parameter_choice). Raises SequenceParameterError for a wrong
    type and SequenceIdRequired without an id (Triton's words), except on an `iterative` model, where a request
    without an id (0 or "") is one of its own (`SequenceTable.assign` gives it one)."""
    flags = check_parameter_types(parameters)
    if flags.id in (0, "") and not iterative:
        raise SequenceIdRequired(
            f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
        )
    return flags


def check_parameter_types(parameters: Mapping[str, tuple[str, object]]) -> SequenceFlags:
    """The sequence parameters' values, their types checked, for a request to ANY model (Triton checks them even
    on a model without sequence_batching, which then ignores them): `sequence_id` an int64_param, uint64_param
    or string_param (a number as its 64-bit value, 0..2**64-1), the flags bool_params. Raises
    SequenceParameterError naming the parameter and the type."""
    sequence_id: SequenceId = 0
    if "sequence_id" in parameters:
        kind, value = parameters["sequence_id"]
        if kind in ("int64_param", "uint64_param") and isinstance(value, int):
            # Triton reads an int64 id as uint64: -1 and 2**64 - 1 name one sequence (and one CORRID value).
            sequence_id = value % ID_MODULUS
        elif kind == "string_param" and isinstance(value, str):
            sequence_id = value
        else:  # Triton's words (it takes no uint64_param; slotserve does)
            raise SequenceParameterError(
                "invalid value type for 'sequence_id' parameter, expected int64_param, uint64_param or "
                f"string_param (got {kind})"
            )
    start, end = (_flag(parameters, name) for name in ("sequence_start", "sequence_end"))
    return SequenceFlags(sequence_id, start, end)


def _flag(parameters: Mapping[str, tuple[str, object]], name: str) -> bool:
    if name not in parameters:
        return False
    kind, value = parameters[name]
    if kind != "bool_param":
        raise SequenceParameterError(f"invalid value type for '{name}' parameter, expected bool_param (got {kind})")
    return bool(value)


class Sequence:
    """One sequence: its slot, its queued turns, its implicit state. Fields are guarded by its table's lock."""

    __slots__ = (
        "id",
        "phase",
        "slot",
        "context",
        "turns",
        "running",
        "last_active",
        "states",
        "pool",
        "ended_why",
        "_granted",
    )

    def __init__(self, sequence_id: SequenceId, now: float) -> None:
        self.id = sequence_id
        self.phase = SequencePhase.WAITING
        self.slot = -1  # its sequence slot
        self.context = -1  # the instance (context index) its requests run on: fixed with its slot
        self.turns: deque[Turn] = deque()  # its requests not yet run, in arrival order
        self.running: Turn | None = None
        self.last_active = now
        self.states: dict[str, np.ndarray] = {}
        self.pool: object | None = None  # the pool its first run used: another pool means it was reloaded
        self.ended_why = ""
        self._granted = threading.Event()  # set when the sequence gets its slot (or ends waiting)

    def move(self, phase: SequencePhase) -> None:
        if phase not in _TRANSITIONS[self.phase]:
            raise RuntimeError(f"sequence {self.id}: {self.phase.value} -> {phase.value} is not allowed")
        self.phase = phase


@dataclass(eq=False)
class Turn:
    """One request of a sequence, from its arrival until `SequenceTable.finish`."""

    sequence: Sequence
    flags: SequenceFlags
    number: int
    woken: threading.Event = field(default_factory=threading.Event)
    restart: bool = False  # this execution starts the sequence (again): START control true, initial state
    closes: bool = False  # its sequence ends when it finishes: END, or an iterative sequence's START
    executions: int = 0  # earlier executions of its request (an iterative sequence's model rescheduled it)

    @property
    def ends(self) -> bool:
        """The END control of this execution: the request's END, on its first execution only (Triton's flags)."""
        return self.flags.end and self.executions == 0

    @property
    def slot(self) -> int:
        return self.sequence.slot

    @property
    def context(self) -> int:
        return self.sequence.context


@dataclass(frozen=True)
class SequenceStatistics:
    capacity: int
    open: int  # sequences holding a slot
    waiting_starts: int  # starts waiting for a slot
    queued_turns: int  # requests of open sequences waiting for their turn
    running: int  # turns running (at most one per sequence)
    slots_in_use: tuple[int, ...]
    ended: int  # sequences ended since the table was made
    idle_ended: int


class SequenceTable:
    """A model's sequences and sequence slots. Thread-safe; see the module docstring for the rule.

    Longer than the house's ~300 lines for a reason: one lock guards the table and every sequence's fields, and each
    method is one step of the rule under it (a turn taken, waited for, rescheduled, finished; slots handed; idle
    sequences swept); split over classes, the fields a step changes would be guarded by a lock held elsewhere."""

    def __init__(self, model: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self._clock = clock
        # guards: _sequences, _waiting, _ended_ids, _capacity, _instances, _ended, _idle_ended, every Sequence's fields
        self._lock = threading.Lock()
        self._sequences: dict[SequenceId, Sequence] = {}  # WAITING and OPEN ones
        self._waiting: deque[Sequence] = deque()  # starts waiting for a slot, oldest first
        self._ended_ids: OrderedDict[SequenceId, str] = OrderedDict()  # id -> why it ended
        self._capacity = 1  # sequence slots
        self._instances = 1  # contexts the slots are spread over (slot % instances)
        self._numbers = itertools.count(1)
        self._assigned = itertools.count(1)  # AssignedId numbers (iterative sequences' requests without an id)
        self._ended = 0
        self._idle_ended = 0

    # ---- a request's turn ---------------------------------------------------------------------------------

    def assign(self, flags: SequenceFlags) -> SequenceFlags:
        """The flags of an iterative sequence's request that came without an id: a new AssignedId, START (and no
        END: Triton's iterative sequencer sets the flags to START alone). Never blocks."""
        with self._lock:
            number = next(self._assigned)
        return replace(flags, id=AssignedId(number), start=True, end=False)

    def enter(
        self,
        flags: SequenceFlags,
        spec: SequenceSpec,
        capacity: int,
        deadline: float | None,
        cancel: CancelToken | None = None,
        instances: int | None = None,
    ) -> Turn:
        """Take this request's turn in its sequence: returns once it may run (the sequence holds a slot and every
        earlier request of it is done). `capacity` sequence slots are spread over `instances` contexts (None: one
        slot per context). A START of a new sequence first waits for a free slot (FIFO). Blocks
        until `deadline` (None: no limit); raises AdmissionTimeout past it, RequestCancelled when `cancel`
        fires, SequenceNotStarted for a request of a sequence that is not open. The caller must call `finish`
        with the returned turn, whatever happens next."""
        idle_s = spec.max_idle_us / 1e6
        with self._lock:
            self._capacity = max(1, capacity)
            self._instances = max(1, min(self._capacity, instances or self._capacity))
            now = self._clock()
            sequence = self._sequences.get(flags.id)
            if sequence is not None and self._expired_locked(sequence, now, idle_s):
                self._end_locked(sequence, f"it was idle for more than {spec.max_idle_us} microseconds", idle=True)
                sequence = None
            if sequence is None:
                if not flags.start:
                    raise SequenceNotStarted(self._not_started_message(flags.id))
                sequence = self._open_locked(flags.id, now, idle_s)
            closes = flags.end or (spec.iterative and flags.start)
            turn = Turn(sequence, flags, next(self._numbers), restart=flags.start, closes=closes)
            sequence.turns.append(turn)
            self._wake_next_locked(sequence)
        self._wait_turn(turn, deadline, cancel, idle_s)
        return turn

    def _open_locked(self, sequence_id: SequenceId, now: float, idle_s: float) -> Sequence:
        sequence = Sequence(sequence_id, now)
        self._sequences[sequence_id] = sequence
        self._ended_ids.pop(sequence_id, None)
        self._waiting.append(sequence)
        self._sweep_locked(now, idle_s)
        self._hand_slots_locked()
        return sequence

    def again(self, turn: Turn, spec: SequenceSpec, deadline: float | None, cancel: CancelToken | None = None) -> None:
        """`turn`'s request ran and its model rescheduled it (an iterative sequence): it goes back to the end of
        its sequence's queue, behind the requests that came meanwhile, and this returns once it may run again (its
        START and END controls false from now on). Blocks until `deadline`; raises as `enter` does,
        SequenceNotStarted at once when the sequence ended while it ran, and AdmissionTimeout at once when
        `deadline` has passed (a model that reschedules for ever stops at its caller's deadline, even where no
        queue wait would notice). The caller still `finish`es the turn."""
        with self._lock:
            sequence = turn.sequence
            if sequence.running is turn:
                sequence.running = None
            if sequence.phase is not SequencePhase.OPEN:
                raise SequenceNotStarted(self._ended_message(sequence))
            if deadline is not None and self._clock() >= deadline:
                raise AdmissionTimeout(
                    f"model '{self.model}': sequence {turn.flags.id}'s request was rescheduled by its model "
                    f"{turn.executions + 1} time{'s' if turn.executions else ''} and its deadline passed"
                )
            turn.executions += 1
            turn.restart = False
            turn.woken.clear()
            sequence.turns.append(turn)
            sequence.last_active = self._clock()
            self._wake_next_locked(sequence)
        self._wait_turn(turn, deadline, cancel, spec.max_idle_us / 1e6)

    def _wait_turn(self, turn: Turn, deadline: float | None, cancel: CancelToken | None, idle_s: float) -> None:
        """Block until `turn` may run. While waiting for a slot, wake when an idle sequence may expire (there is
        no timer thread: a waiting start ends idle sequences itself)."""
        if cancel is not None:
            cancel.add_callback(turn.woken.set)
        try:
            while not turn.woken.is_set():
                now = self._clock()
                if cancel is not None and cancel.cancelled:
                    self._leave(turn, RequestCancelled("the caller gave up while its sequence request waited"))
                if deadline is not None and now >= deadline:
                    self._leave(turn, self._timeout_error(turn))
                wait = self._next_wake(now, deadline, idle_s)
                turn.woken.wait(wait)
                if not turn.woken.is_set():
                    with self._lock:
                        self._sweep_locked(self._clock(), idle_s)
                        self._hand_slots_locked()
        finally:
            if cancel is not None:
                cancel.remove_callback(turn.woken.set)
        with self._lock:
            if turn.sequence.running is turn:
                return
        # Woken without its turn: by its cancel, or because its sequence ended.
        if cancel is not None and cancel.cancelled:
            self._leave(turn, RequestCancelled("the caller gave up while its sequence request waited"))
        self._leave(turn, SequenceNotStarted(self._ended_message(turn.sequence)))

    def _next_wake(self, now: float, deadline: float | None, idle_s: float) -> float | None:
        """Seconds until the deadline or the earliest idle expiry, whichever comes first (None: neither)."""
        with self._lock:
            expiries = [
                s.last_active + idle_s
                for s in self._sequences.values()
                if s.phase is SequencePhase.OPEN and s.running is None and not s.turns
            ]
        wake = min(expiries, default=None)
        if deadline is not None:
            wake = deadline if wake is None else min(wake, deadline)
        return None if wake is None else max(0.001, wake - now)

    def _timeout_error(self, turn: Turn) -> Exception:
        if turn.sequence.phase is SequencePhase.WAITING:
            return AdmissionTimeout(
                f"model '{self.model}' had no free sequence slot for sequence {turn.flags.id} before the admission "
                f"deadline ({self._capacity} sequence slot{'s' if self._capacity != 1 else ''}, all held by open "
                "sequences)"
            )
        return AdmissionTimeout(
            f"model '{self.model}': sequence {turn.flags.id}'s earlier request did not finish before this "
            "request's admission deadline"
        )

    def _leave(self, turn: Turn, error: Exception) -> None:
        """`turn` gives up before running: out of its sequence's queue (a start that never got a slot ends its
        sequence). Raises `error`."""
        with self._lock:
            sequence = turn.sequence
            if sequence.running is turn:
                sequence.running = None
            elif turn in sequence.turns:
                sequence.turns.remove(turn)
            if sequence.phase is SequencePhase.WAITING and not sequence.turns and sequence.running is None:
                self._waiting.remove(sequence)
                self._end_locked(sequence, "its start gave up before it had a slot")
            elif sequence.phase is SequencePhase.OPEN:
                sequence.last_active = self._clock()
                self._wake_next_locked(sequence)
        raise error

    # ---- a turn's run -------------------------------------------------------------------------------------

    def bind(self, turn: Turn, pool: object) -> None:
        """Called with the turn's lease held, before it runs: raises SequenceNotStarted if the sequence was
        ended meanwhile (its model reconfigured or unloaded while the turn waited for its lease) or its model
        now serves another pool (the sequence's state belongs to the old one)."""
        with self._lock:
            sequence = turn.sequence
            if sequence.phase is SequencePhase.OPEN and sequence.pool is not None and sequence.pool is not pool:
                self._end_locked(sequence, "its model was reloaded or reconfigured")
            if sequence.phase is not SequencePhase.OPEN:
                raise SequenceNotStarted(self._ended_message(sequence))
            sequence.pool = pool
            if turn.restart:
                sequence.states = {}

    def begin(self, turn: Turn, *, restart: bool = True) -> None:
        """`oldest`'s `bind` (a batch runs on any slot): raises SequenceNotStarted if the sequence was ended
        meanwhile; a restarting turn (with `restart`) drops the sequence's state first."""
        with self._lock:
            sequence = turn.sequence
            if sequence.phase is not SequencePhase.OPEN:
                raise SequenceNotStarted(self._ended_message(sequence))
            if restart and turn.restart:
                sequence.states = {}

    def inputs(self, turn: Turn, spec: SequenceSpec, batched: bool) -> dict[str, np.ndarray]:
        """The control inputs and state inputs of `turn` (batched: a leading batch dimension of 1). Raises
        SequenceParameterError for an id the CORRID input cannot hold."""
        shape = (1, 1) if batched else (1,)
        filled: dict[str, np.ndarray] = {}
        for control in spec.controls:
            if control.kind == CORRID:
                filled[control.input_name] = corrid_input(control.datatype, turn.flags.id, shape)
                continue
            on = {START: turn.restart, END: turn.ends, READY: True}[control.kind]
            value = control.true_value if on else control.false_value
            filled[control.input_name] = np.full(shape, value, datatypes.numpy_dtype(control.datatype))
        with self._lock:
            kept = dict(turn.sequence.states)
        for state in spec.states:
            array = kept.get(state.input_name)
            if array is None:
                array = state.initial_array()
                if batched:
                    array = array[np.newaxis]
            filled[state.input_name] = array
        return filled

    @staticmethod
    def shown_to_model(turn: Turn, info: RequestInfo | None) -> RequestInfo:
        """What the model is shown of this execution of `turn` (a python model's `correlation_id()` and `flags()`):
        the id as Triton shows it (a number's 64-bit value; an assigned id's number) and the START / END flags of
        this execution (none on a rescheduled one)."""
        flags = (START_FLAG if turn.restart else 0) | (END_FLAG if turn.ends else 0)
        shown = turn.flags.id.number if isinstance(turn.flags.id, AssignedId) else turn.flags.id
        return replace(info or RequestInfo(), correlation_id=shown, flags=flags)

    def keep_states(self, turn: Turn, spec: SequenceSpec, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """After a successful run: store its state outputs as the sequence's next state inputs, and return the
        other outputs (the client's). Raises ModelError if the model returned no state output (the sequence's
        state stays as it was)."""
        if not spec.states:
            return outputs
        states: dict[str, np.ndarray] = {}
        for state in spec.states:
            array = outputs.pop(state.output_name, None)
            if array is None:  # the model's fault, not the request's
                raise ModelError(
                    f"model '{self.model}' returned no state output '{state.output_name}' for sequence {turn.flags.id}"
                )
            states[state.input_name] = np.array(array, copy=True)  # its own memory, not the run's
        with self._lock:
            turn.sequence.states = states
        return outputs

    def finish(self, turn: Turn) -> None:
        """The turn is done (ran, failed or left): the sequence's next request may run; an END (or an iterative
        sequence's START request) ends the sequence and frees its slot for the oldest waiting start. Never
        blocks."""
        with self._lock:
            sequence = turn.sequence
            if sequence.running is turn:
                sequence.running = None
            elif turn in sequence.turns:
                sequence.turns.remove(turn)
            sequence.last_active = self._clock()
            if sequence.phase is SequencePhase.OPEN and turn.closes:
                self._end_locked(sequence, _why_closed(turn))
            elif sequence.phase is SequencePhase.OPEN:
                self._wake_next_locked(sequence)
            self._hand_slots_locked()

    # ---- the model's pool was retired --------------------------------------------------------------------

    def end_all(self, why: str) -> int:
        """End every open sequence (its model's pool is being retired: reconfigured, unloaded, evicted or closed at
        shutdown); their queued requests are refused naming `why`. Starts still waiting for a slot keep waiting
        and get the freed slots. Never blocks; may be called under the model lock. Returns how many ended."""
        with self._lock:
            ended = [s for s in self._sequences.values() if s.phase is SequencePhase.OPEN]
            for sequence in ended:
                self._end_locked(sequence, why)
            self._hand_slots_locked()
            return len(ended)

    def open_count(self) -> int:
        """Sequences holding a slot (may be called under the model lock)."""
        with self._lock:
            return sum(1 for s in self._sequences.values() if s.phase is SequencePhase.OPEN)

    def pending_count(self) -> int:
        """Requests waiting for their turn: starts waiting for a sequence slot and the queued requests of open
        sequences (Triton counts both as pending). The turns that run, and the admission queue behind them, are
        not counted here. Never blocks for long; may be called under the model lock."""
        with self._lock:
            return sum(len(s.turns) for s in self._sequences.values())

    def sweep(self, spec: SequenceSpec) -> int:
        """End the sequences idle for longer than the spec allows now; returns how many."""
        with self._lock:
            ended = self._sweep_locked(self._clock(), spec.max_idle_us / 1e6)
            self._hand_slots_locked()
            return ended

    def statistics(self) -> SequenceStatistics:
        with self._lock:
            open_ = [s for s in self._sequences.values() if s.phase is SequencePhase.OPEN]
            return SequenceStatistics(
                capacity=self._capacity,
                open=len(open_),
                waiting_starts=len(self._waiting),
                queued_turns=sum(len(s.turns) for s in open_),
                running=sum(1 for s in open_ if s.running is not None),
                slots_in_use=tuple(sorted(s.slot for s in open_)),
                ended=self._ended,
                idle_ended=self._idle_ended,
            )

    # ---- under the lock -----------------------------------------------------------------------------------

    @staticmethod
    def _expired_locked(sequence: Sequence, now: float, idle_s: float) -> bool:
        return (
            sequence.phase is SequencePhase.OPEN
            and sequence.running is None
            and not sequence.turns
            and now - sequence.last_active >= idle_s
        )

    def _sweep_locked(self, now: float, idle_s: float) -> int:
        expired = [s for s in self._sequences.values() if self._expired_locked(s, now, idle_s)]
        for sequence in expired:
            self._end_locked(sequence, f"it was idle for more than {round(idle_s * 1e6)} microseconds", idle=True)
        return len(expired)

    def _hand_slots_locked(self) -> None:
        """Hand free slots to the oldest waiting starts (no barging: only here, in FIFO order), each the free slot
        of the instance that runs the fewest open sequences (so that sequences spread over the instances)."""
        if not self._waiting:
            return
        open_ = [s for s in self._sequences.values() if s.phase is SequencePhase.OPEN]
        used = {s.slot for s in open_}
        load = [0] * self._instances
        for sequence in open_:
            if 0 <= sequence.context < self._instances:
                load[sequence.context] += 1
        free = [slot for slot in range(self._capacity) if slot not in used]
        while self._waiting and free:
            slot = min(free, key=lambda slot: (load[slot % self._instances], slot))
            free.remove(slot)
            load[slot % self._instances] += 1
            sequence = self._waiting.popleft()
            sequence.slot = slot
            sequence.context = slot % self._instances
            sequence.move(SequencePhase.OPEN)
            sequence.last_active = self._clock()
            self._wake_next_locked(sequence)

    def _wake_next_locked(self, sequence: Sequence) -> None:
        """Let the sequence's oldest queued request run, if it holds a slot and nothing of it runs."""
        if sequence.phase is SequencePhase.OPEN and sequence.running is None and sequence.turns:
            turn = sequence.turns.popleft()
            sequence.running = turn
            turn.woken.set()

    def _end_locked(self, sequence: Sequence, why: str, *, idle: bool = False) -> None:
        sequence.move(SequencePhase.ENDED)
        sequence.ended_why = why
        sequence.states = {}
        if self._sequences.get(sequence.id) is sequence:
            del self._sequences[sequence.id]
        self._ended_ids[sequence.id] = why
        self._ended_ids.move_to_end(sequence.id)
        while len(self._ended_ids) > ENDED_MEMORY:
            self._ended_ids.popitem(last=False)
        self._ended += 1
        self._idle_ended += idle
        for turn in sequence.turns:  # its queued requests are refused (each wakes, finds it ended)
            turn.woken.set()

    def _not_started_message(self, sequence_id: SequenceId) -> str:
        """Triton's words (its clients and QA tests read them), then, for a sequence that ended, why it did."""
        why = self._ended_ids.get(sequence_id)
        words = (
            f"inference request for sequence {sequence_id} to model '{self.model}' must specify the START flag on "
            "the first request of the sequence"
        )
        if why is not None:
            return f"{words}: the sequence was ended because {why}; start a new one with sequence_start"
        return words

    def _ended_message(self, sequence: Sequence) -> str:
        return (
            f"inference request for sequence {sequence.id} to model '{self.model}' must specify the START flag on "
            f"the first request of the sequence: the sequence was ended because {sequence.ended_why or 'it ended'}; "
            "start a new one with sequence_start"
        )


def _why_closed(turn: Turn) -> str:
    if turn.flags.end:
        return "its END request was served"
    return "the request that started it finished (an iterative sequence ends with it)"


def check_batch_of_one(model: str, signature: Mapping[str, tuple[str, tuple[int, ...]]], batched: bool) -> None:
    if batched and any(shape and shape[0] != 1 for _, shape in signature.values()):
        raise InvalidRequest(
            f"inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
        )


def corrid_input(datatype: str, sequence_id: SequenceId, shape: tuple[int, ...]) -> np.ndarray:
    """The CORRID control input of a sequence: its id in the configured type. Raises SequenceParameterError for a
    string id on a numeric CORRID, and for a number the type cannot hold."""
    if isinstance(sequence_id, AssignedId):
        sequence_id = sequence_id.number
    if datatype == "BYTES":
        array = np.empty(shape, dtype=object)
        array.fill(str(sequence_id).encode())
        return array
    if isinstance(sequence_id, str):
        raise SequenceParameterError(
            f"sequence id '{sequence_id}' is a string; the model's CORRID control input is {datatype}"
        )
    value = _corrid_value(datatype, sequence_id)
    if value is None:
        raise SequenceParameterError(f"sequence id {sequence_id} does not fit the model's CORRID input ({datatype})")
    return np.full(shape, value, datatypes.numpy_dtype(datatype))


_corrid = corrid_input  # the name the unit tests know it by


def _corrid_value(datatype: str, key: int) -> int | None:
    """The CORRID value of the numeric id `key` (its 64-bit value, 0..2**64-1), None when the type cannot hold it:
    UINT64 takes it as it is, INT64 as the signed number of the same bits (2**64 - 1 is -1), a 32-bit type the id
    when it fits, or the 32 bits of a negative int64 id that fits INT32 (-3 is 2**32 - 3 in UINT32), as Triton's
    casts give them. So an id sent as int64 or as uint64 gets one value, or one refusal."""
    signed = key - ID_MODULUS if key >= ID_MODULUS // 2 else key
    if datatype == "UINT64":
        return key
    if datatype == "INT64":
        return signed
    limits = np.iinfo(datatypes.numpy_dtype(datatype))
    if limits.min <= key <= limits.max:
        return key
    if -(2**31) <= signed < 0:
        return signed if limits.min < 0 else signed + 2**32
    return None


__all__ = [
    "AssignedId",
    "SequenceFlags",
    "SequenceIdRequired",
    "SequenceNotStarted",
    "SequenceParameterError",
    "SequencePhase",
    "SequenceStatistics",
    "SequenceTable",
    "Turn",
    "check_parameter_types",
    "corrid_input",
    "read_flags",
]

"""service/frontends/supervisor.py + forwarded.py's InlineGate: which forwarded ModelInfers a link's reader runs
itself and which it hands to a handler thread. The supervisor's own dispatch runs against a recording link, an
executor that only records what it is given (a handed-off call has not reached admission until the test runs it)
and a runner whose model is idle or not as the test says: no process, no socket."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from service.frontends import forwarded
from service.frontends.forwarded import HandlerTable
from service.frontends.infer import MODEL_INFER
from service.frontends.messages import CallEnd, CallStart, InferAnswer, InferCall
from service.frontends.supervisor import Frontends, FrontendSettings, _Running


class RecordingLink:
    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, record: object) -> None:
        self.sent.append(record)

    def ended(self) -> list[int]:
        return [record.call_id for record in self.sent if isinstance(record, CallEnd)]


class HeldExecutor:
    """Keeps what is submitted; `run_all` runs it (the handed-off calls reach admission only then)."""

    def __init__(self) -> None:
        self.held: list[tuple[Any, tuple[Any, ...]]] = []

    def submit(self, function: Any, *args: Any) -> None:
        self.held.append((function, args))

    def run_all(self) -> None:
        held, self.held = self.held, []
        for function, args in held:
            function(*args)


class Runner:
    """ForwardedInfer's part the gate and run_infer use: a model admits at once when it is in `idle`."""

    def __init__(self) -> None:
        self.idle: set[str] = set()
        self.ran: list[tuple[int, str]] = []  # (call id, thread name) in the order the calls reached the model

    def admits_now(self, call: InferCall) -> bool:
        return call.model in self.idle

    def take(self, call: InferCall) -> InferCall:
        return call

    def ModelInfer(self, taken: InferCall, context: Any) -> InferAnswer:
        self.ran.append((taken.start.call_id, threading.current_thread().name))
        return InferAnswer(taken.model, "1", taken.id, ())


def _infer(call_id: int, model: str = "m") -> InferCall:
    start = CallStart(call_id, MODEL_INFER, (), None, "peer", None)
    return InferCall(start, model, "", "", {}, (), (), 0, {}, b"")


@pytest.fixture
def setup():
    runner = Runner()
    executor = HeldExecutor()
    settings = FrontendSettings((), 1, 1, False, None)
    frontends = Frontends(1, HandlerTable(), executor, settings, lambda: True, runner)  # type: ignore[arg-type]
    link = RecordingLink()
    running = _Running(0, None, link)  # type: ignore[arg-type]
    return frontends, running, runner, executor, link


def test_an_idle_models_call_runs_on_the_reader_and_answers(setup):
    frontends, running, runner, executor, link = setup
    runner.idle.add("m")
    frontends._dispatch(running, _infer(1))
    assert executor.held == []
    assert runner.ran == [(1, threading.current_thread().name)]
    assert link.ended() == [1]
    assert running.find(1) is None  # ended and forgotten


def test_a_call_that_would_wait_is_handed_off(setup):
    frontends, running, runner, executor, link = setup
    frontends._dispatch(running, _infer(1))  # the model is busy
    assert runner.ran == [] and len(executor.held) == 1
    executor.run_all()
    assert [call_id for call_id, _ in runner.ran] == [1] and link.ended() == [1]


def test_an_inline_call_never_overtakes_a_handed_off_call_of_its_model(setup):
    frontends, running, runner, executor, link = setup
    frontends._dispatch(running, _infer(1))  # busy: handed off, not at admission yet
    runner.idle.update({"m", "other"})  # the model looks idle before the handed-off call arrived
    frontends._dispatch(running, _infer(2))
    frontends._dispatch(running, _infer(3, "other"))  # another model is not held back
    assert [call_id for call_id, _ in runner.ran] == [3]
    executor.run_all()
    assert [call_id for call_id, _ in runner.ran] == [3, 1, 2]  # FIFO for "m": 1 before 2
    frontends._dispatch(running, _infer(4))  # nothing of "m" handed off any more: inline again
    assert runner.ran[-1] == (4, threading.current_thread().name) and executor.held == []


def test_a_generic_path_model_infer_holds_back_every_inline_call_until_it_ends(setup):
    frontends, running, runner, executor, link = setup
    runner.idle.add("m")
    frontends._dispatch(running, CallStart(1, MODEL_INFER, (), None, "peer", b"\x00"))  # its model is unknown
    frontends._dispatch(running, _infer(2))
    assert runner.ran == [] and len(executor.held) == 2
    executor.run_all()  # the generic call ends (UNIMPLEMENTED: the table has no servicer) and 2 runs
    assert link.ended() == [1, 2]
    frontends._dispatch(running, _infer(3))
    assert executor.held == [] and runner.ran[-1][0] == 3


def test_no_inline_call_while_the_link_has_a_stream_open(setup):
    frontends, running, runner, executor, link = setup
    runner.idle.add("m")
    frontends._dispatch(running, CallStart(1, "/inference.GRPCInferenceService/ModelStreamInfer", (), None, "p", None))
    frontends._dispatch(running, _infer(2))
    assert runner.ran == [] and len(executor.held) == 2
    executor.run_all()
    assert link.ended() == [1, 2] and running.streams_open == 0


def test_a_slow_inline_call_hands_its_models_calls_off_for_a_while(setup, monkeypatch):
    frontends, running, runner, executor, link = setup
    monkeypatch.setattr(forwarded, "INLINE_BUDGET_SECONDS", 0.0)  # every run is over the budget
    runner.idle.update({"m", "other"})
    frontends._dispatch(running, _infer(1))  # inline, found slow
    frontends._dispatch(running, _infer(2))
    assert [call_id for call_id, _ in runner.ran] == [1] and len(executor.held) == 1
    monkeypatch.setattr(forwarded, "SLOW_RETRY_SECONDS", 0.0)
    frontends._dispatch(running, _infer(3, "other"))  # another model: inline, then marked slow for 0 s
    frontends._dispatch(running, _infer(4, "other"))  # its while is over: inline again
    assert [call_id for call_id, _ in runner.ran] == [1, 3, 4]


class _Statistics:
    def __init__(self, runs: int, ns_each: int) -> None:
        timing = type("Timing", (), {"count": runs, "ns": runs * ns_each})
        empty = type("Timing", (), {"count": 0, "ns": 0})
        self._snapshot = type(
            "Snapshot", (), {"compute_infer": timing, "compute_input": empty, "compute_output": empty}
        )

    def snapshot(self):
        return self._snapshot


class _Entry:
    """What ForwardedInfer.admits_now reads of a ModelEntry: an idle, READY, quick model of `backend`."""

    def __init__(self, backend: str) -> None:
        self.spec = type("Spec", (), {"backend": backend})
        self.statistics = _Statistics(runs=100, ns_each=50_000)  # 50 us a run: quick
        self.batches = False
        self.admission = type("Admission", (), {"core": type("Core", (), {"idle": True})})

    def is_ready(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("backend", "inline"), [("onnxruntime", True), ("tensorrt", True), ("python", False), ("fixture", False)]
)
def test_only_engines_that_run_no_model_code_run_on_the_reader(backend, inline):
    """A python model's execute (or a fixture held by a gate) can block on anything: run on the link's reader, it
    would leave the link unread (its cancels, the front end's death) until it returned. ONNX Runtime and TensorRT
    only compute, and only a quick model's runs are taken there."""
    from service.frontends.infer import ForwardedInfer

    class Dataplane:
        def resolve(self, model: str, version: str) -> _Entry:
            return _Entry(backend)

    runner = ForwardedInfer(None, None, Dataplane())  # type: ignore[arg-type]
    assert runner.admits_now(_infer(1)) is inline

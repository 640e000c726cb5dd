"""Generated ModelInfer requests, valid and mutated, one at a time and in concurrent bursts (see the package
docstring for what every test asserts)."""

from __future__ import annotations

import grpc
from hypothesis import given, note, settings
from hypothesis import strategies as st

from client import ClientError

from .lab import CALL_TIMEOUT, FUZZ, NO_DEADLINE, examples
from .mutations import cases
from .outcomes import Ledger, assert_server_clean, check_response, check_status, statistics, summary
from .valid_requests import Case, gated_requests


def test_infer_fuzz_sequential(running, stub):
    """One request at a time: every status allowed, valid requests succeed, OK responses correct."""
    ledger = Ledger()
    before = statistics(running)

    @settings(FUZZ, max_examples=examples(2200))
    @given(case=cases())
    def one(case: Case) -> None:
        note(repr(case))
        try:
            response = stub.ModelInfer(case.request, timeout=CALL_TIMEOUT)
            code, error = "OK", None
        except grpc.RpcError as rpc_error:
            error = ClientError.from_rpc_error(rpc_error)
            code = error.code
        ledger.record(case.request, code)
        assert code != "DEADLINE_EXCEEDED", f"the call did not end within {CALL_TIMEOUT} s (a hang)"
        check_status(case, code, error, alone=True)
        if code == "OK":
            check_response(case.request, response, read_regions=True)  # one request at a time: fuzz_out is its

    one()
    print(f"\nsequential fuzz: {sum(ledger.statuses.values())} requests: {summary(ledger)}")
    assert_server_clean(running, stub, ledger, before)


def test_infer_fuzz_concurrent(lab, running, stub):
    """Batches of generated requests sent at once (one slot and a queue of one per model), some with a deadline
    and some without one (as the server sees it). In half the batches the fixture model `gated` holds its slot
    at its execute gate until every other answer is in, so its requests queue, time out on their `timeout`
    parameter or find the queue full: admission refusals meet corrupt input."""
    ledger = Ledger()
    before = statistics(running)

    @settings(FUZZ, max_examples=examples(130))
    @given(
        batch=st.lists(st.tuples(st.one_of(cases(), gated_requests()), st.booleans()), min_size=2, max_size=12),
        hold=st.booleans(),
    )
    def burst(batch: list[tuple[Case, bool]], hold: bool) -> None:
        gate = lab.controls.gate("gated", "execute")
        if hold:
            gate.hold()  # the request that takes gated's one slot stays there; the next queues, later ones are refused
        futures = [
            stub.ModelInfer.future(case.request, timeout=CALL_TIMEOUT if bounded else NO_DEADLINE)
            for case, bounded in batch
        ]
        held = [i for i, (case, _) in enumerate(batch) if case.request.model_name == "gated"]
        order = [i for i in range(len(batch)) if i not in held] + held  # gated's answers last, after the release
        try:
            for position, index in enumerate(order):
                if position == len(order) - len(held):
                    gate.release()
                case, future = batch[index][0], futures[index]
                try:
                    response = future.result(timeout=CALL_TIMEOUT)
                    code, error = "OK", None
                except grpc.FutureTimeoutError:
                    raise AssertionError(f"the call did not end within {CALL_TIMEOUT} s (a hang): {case!r}") from None
                except grpc.RpcError as rpc_error:
                    error = ClientError.from_rpc_error(rpc_error)
                    code = error.code
                ledger.record(case.request, code)
                assert code != "DEADLINE_EXCEEDED", f"the call did not end within {CALL_TIMEOUT} s: {case!r}"
                check_status(case, code, error, alone=False)
                if code == "OK":
                    check_response(case.request, response)
        finally:
            gate.release()
            for future in futures:
                future.cancel()  # no-op for finished calls; a hung one must not outlive the example

    burst()
    print(f"\nconcurrent fuzz: {sum(ledger.statuses.values())} requests: {summary(ledger)}")
    assert_server_clean(running, stub, ledger, before)

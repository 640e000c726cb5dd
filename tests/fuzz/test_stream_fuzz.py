"""The generated requests on ModelStreamInfer."""

from __future__ import annotations

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from client import ClientError

from .lab import CALL_TIMEOUT, FUZZ, INTERNAL_MESSAGES, MODELS, examples
from .mutations import cases
from .outcomes import Ledger, assert_server_clean, check_response, statistics, summary
from .valid_requests import Case


def test_stream_fuzz(running, stub):
    """The same requests on ModelStreamInfer: one answer per request, in order; an error is an error_message
    that is never an internal error; the stream itself ends OK."""
    ledger = Ledger()
    before = statistics(running)

    @settings(FUZZ, max_examples=examples(150))
    @given(batch=st.lists(cases(), min_size=1, max_size=6))
    def stream(batch: list[Case]) -> None:
        call = stub.ModelStreamInfer(iter([case.request for case in batch]), timeout=CALL_TIMEOUT)
        try:
            answers = list(call)
        except grpc.RpcError as rpc_error:
            raise AssertionError(f"the stream failed: {ClientError.from_rpc_error(rpc_error)}") from None
        assert len(answers) == len(batch), f"{len(answers)} answers for {len(batch)} requests"
        for case, answer in zip(batch, answers, strict=True):
            code = "OK" if not answer.error_message else "ERROR"
            ledger.record(case.request, code)
            if answer.error_message:
                assert not answer.error_message.startswith(INTERNAL_MESSAGES), (
                    f"internal error {answer.error_message!r} for {case!r}"
                )
                assert answer.infer_response.id == case.request.id
                assert case.mutations, f"valid request failed on a stream: {answer.error_message!r}"
            else:
                assert case.request.model_name in MODELS, f"answered unknown model: {case!r}"
                check_response(case.request, answer.infer_response)

    stream()
    print(f"\nstream fuzz: {sum(ledger.statuses.values())} requests: {summary(ledger)}")
    assert_server_clean(running, stub, ledger, before)

"""Bytes that may not be a message at all: random, corrupted and extended serialized requests, through a
generic method with identity serializers."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, note, settings
from hypothesis import strategies as st

from client import ClientError
from generated import grpc_service_pb2 as pb

from .lab import ALLOWED, CALL_TIMEOUT, FUZZ, GRPC_DESERIALIZE_FAILURE, INFER_METHOD, LARGE_WIDTH, MODELS, examples
from .outcomes import Ledger, assert_server_clean, check_response, small_request_succeeds, statistics, summary
from .valid_requests import Case, valid_requests


def _varint(value: int) -> bytes:
    # Written again on purpose rather than imported from service/transport/wire.py: the fuzzer must not share the code
    # it tests.
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@st.composite
def unknown_fields(draw) -> bytes:
    """One field of any wire type (groups included), field numbers known and unknown; well-formed or not."""
    number = draw(st.one_of(st.sampled_from((0, 1, 2, 3, 4, 5, 6, 7, 99, 2**29 - 1)), st.integers(1, 2**29 - 1)))
    wire_type = draw(st.sampled_from((0, 1, 2, 3, 3, 4, 5, 6, 7)))
    well_formed = draw(st.integers(0, 3)) > 0
    key = _varint((number << 3) | wire_type)
    if not well_formed:
        return key + draw(st.binary(max_size=12))
    if wire_type == 0:
        body = _varint(draw(st.integers(0, 2**64 - 1)))
    elif wire_type == 1:
        body = draw(st.binary(min_size=8, max_size=8))
    elif wire_type == 2:
        payload = draw(st.binary(max_size=40))
        body = _varint(len(payload)) + payload
    elif wire_type == 3:  # a group: fields of its own, then the end-group tag of the same number
        inner = b"".join(
            draw(
                st.lists(
                    st.builds(lambda n, v: _varint(n << 3) + _varint(v), st.integers(1, 50), st.integers(0, 2**32)),
                    max_size=3,
                )
            )
        )
        body = inner + _varint((number << 3) | 4)
    elif wire_type == 5:
        body = draw(st.binary(min_size=4, max_size=4))
    else:  # 4 (a stray end-group), 6 and 7 (no such wire type)
        body = b""
    return key + body


class Wire(bytes):
    """Bytes whose repr stays short (a falsifying example may be a 100 KB message): length, head and tail."""

    def __repr__(self) -> str:
        return f"Wire({len(self)} bytes, head={bytes(self[:48])!r}, tail={bytes(self[-48:])!r})"


@st.composite
def hostile_bytes(draw) -> Wire:
    return Wire(draw(_hostile_bytes()))


@st.composite
def _hostile_bytes(draw) -> bytes:
    how = draw(st.sampled_from(("random", "truncated", "flipped", "inserted", "appended", "large_appended")))
    if how == "random":
        return draw(st.binary(max_size=400))
    if how == "large_appended":  # > 64 KiB: parsed by service/transport/wire.py, not protobuf
        base = draw(st.builds(_large_request, st.integers(0, 2**31)))
    else:
        base = draw(valid_requests())
    data = bytearray(base.request.SerializeToString())
    if how == "truncated":
        return bytes(data[: draw(st.integers(0, max(0, len(data) - 1)))])
    if how == "flipped":
        for _ in range(draw(st.integers(1, 6))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "inserted":
        at = draw(st.integers(0, len(data)))
        return bytes(data[:at] + draw(st.binary(min_size=1, max_size=20)) + data[at:])
    fields = draw(st.lists(unknown_fields(), min_size=1, max_size=3))
    at = draw(st.sampled_from(("end", "start")))
    return bytes(data + b"".join(fields)) if at == "end" else bytes(b"".join(fields) + data)


def _large_request(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    request = pb.ModelInferRequest(model_name="identity_fp32", id="large")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, LARGE_WIDTH["identity_fp32"]])
    request.raw_input_contents.append(rng.standard_normal(LARGE_WIDTH["identity_fp32"]).astype("<f4").tobytes())
    return Case(request)


def test_undecodable_bytes(running, stub):
    """Arbitrary bytes as a ModelInfer message, through a generic method with identity serializers.

    What is asserted, and why: if protobuf can decode the bytes, they are a ModelInferRequest like any other and
    the answer must be an allowed status (so slotserve's own large-message parser, service/transport/wire.py, may never
    refuse what protobuf accepts, nor crash on it). If protobuf cannot decode them, the request deserializer
    raises inside grpc before any slotserve code runs, and grpc answers INTERNAL "Exception deserializing
    request!" by itself (grpc's Python server gives a handler no way to change that status); slotserve's own
    INTERNAL ("internal error (reference ...)") is never acceptable. Either way the server must go on serving.
    """
    method = running.client.channel.unary_unary(INFER_METHOD)  # no serializers: bytes in, bytes out
    ledger = Ledger()

    @settings(FUZZ, max_examples=examples(600))
    @given(data=hostile_bytes())
    def send(data: bytes) -> None:
        try:
            decoded = pb.ModelInferRequest.FromString(data)
        except DecodeError:
            decoded = None
        note(f"{len(data)} bytes, protobuf decodes them: {decoded is not None}; head {data[:80]!r}")
        try:
            answer = method(bytes(data), timeout=CALL_TIMEOUT)
            code, error = "OK", None
        except grpc.RpcError as rpc_error:
            error = ClientError.from_rpc_error(rpc_error)
            code = error.code
        ledger.statuses[code] += 1
        assert code != "DEADLINE_EXCEEDED", f"the call did not end within {CALL_TIMEOUT} s (a hang)"
        if decoded is None:
            assert code in {"INTERNAL", "INVALID_ARGUMENT"}, f"undecodable bytes answered {code} ({error})"
            if code == "INTERNAL":
                assert error is not None
                assert error.message == GRPC_DESERIALIZE_FAILURE, f"slotserve's own INTERNAL: {error}"
        else:
            assert code in ALLOWED, f"decodable bytes answered {code} ({error}) for {decoded!r:.2000}"
            if decoded.model_name not in MODELS:
                assert code == "NOT_FOUND", f"unknown model answered {code} ({error})"
            if code == "OK":
                check_response(decoded, pb.ModelInferResponse.FromString(answer))

    send()
    print(f"\nundecodable-bytes fuzz: {sum(ledger.statuses.values())} messages: {summary(ledger)}")
    assert_server_clean(running, stub, Ledger(), statistics(running))


def test_a_large_message_with_a_group_field_is_read_as_protobuf_reads_it(running, stub):
    """Found by test_undecodable_bytes: a valid 80,048-byte request (identity_fp32, [1, 20000] raw FP32) with an
    empty group of field 1 appended (b"\\x0b\\x0c") decodes with protobuf (an unknown field), but
    service/transport/wire.py's large-message scanner refused wire type 3 and grpc answered INTERNAL. Groups now get
    protobuf's verdict."""
    method = running.client.channel.unary_unary(INFER_METHOD)
    case = _large_request(7)
    data = case.request.SerializeToString()
    assert len(data) >= 64 * 1024
    for suffix in (b"\x0b\x0c", b"\x9b\x06\x08\x01\x9c\x06"):  # empty group 1; group 99 holding a varint field
        message = data + suffix
        pb.ModelInferRequest.FromString(message)  # protobuf accepts it
        check_response(case.request, pb.ModelInferResponse.FromString(method(message, timeout=CALL_TIMEOUT)))
    with pytest.raises(grpc.RpcError) as info:  # an unterminated group is malformed for protobuf too
        method(data + b"\x0b", timeout=CALL_TIMEOUT)
    assert (info.value.code().name, info.value.details()) == ("INTERNAL", GRPC_DESERIALIZE_FAILURE)
    small_request_succeeds(stub)

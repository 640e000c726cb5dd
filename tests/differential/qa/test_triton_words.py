"""Not NVIDIA's cases: Triton 2.51's words and codes where its clients and tests read them (issue 34 item 8), asked
of Triton directly and kept as differential questions. slotserve's message starts with (or, where several inputs
are malformed, holds) Triton's text, and says more after it where it knows more.

* Malformed inputs (service/transport/tensors.py): a raw input whose byte size does not match its shape, typed contents of
  the wrong count or field, an input without data, a duplicate input, BYTES inputs with too few or too many
  elements or a cut length prefix. Where several inputs are malformed Triton names one, in an order of its own (a
  hash map's: the second of two); slotserve names each.
* An `execute` that raises: "Failed to process the request(s) for model '<instance>', message: <the exception>".
* RepositoryModelLoad that fails: a version whose load failed, "load failed for model 'x': version N is at
  UNAVAILABLE state: ..." (Triton's code INVALID_ARGUMENT; slotserve keeps the failure's own, FAILED_PRECONDITION
  here, on purpose: docs/errors.md); a configuration that does not read, "failed to load 'x', failed to poll from
  model repository" (Triton's code INTERNAL; slotserve's INVALID_ARGUMENT, the same reason); files without `config`,
  the same words and INTERNAL on both.
* The `triton_grpc_error: true` stream header (Triton's src/grpc/stream_infer_handler.cc): a request refused
  before it runs is still answered with `error_message` and the stream goes on; the first error of a request that
  ran ends the stream with that error's status and message; the header's value must be exactly "true".
"""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import struct

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb

from .harness import Model, build_request, python_model

ZEROS = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.outputs = json.loads(args["model_config"])["output"]

        def execute(self, requests):
            responses = []
            for request in requests:
                rows = request.inputs()[0].as_numpy().shape[0]
                outputs = [
                    pb_utils.Tensor(o["name"], np.zeros([rows, *o["dims"]], pb_utils.triton_string_to_numpy(o["data_type"])))
                    for o in self.outputs
                ]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""

# IN[0] < 0: execute raises; IN[0] == 1: the request is answered with a TritonError (INVALID_ARG); else IN back.
FAILS = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if value[0] < 0:
                    raise ValueError(f"a negative input: {value[0]}")
                if value[0] == 1:
                    error = pb_utils.TritonError("told to fail", pb_utils.TritonError.INVALID_ARG)
                    responses.append(pb_utils.InferenceResponse(error=error))
                else:
                    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            return responses
"""


def _pair(datatype: str) -> str:
    return f"""
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: {datatype} dims: [ 16 ] }}, {{ name: "INPUT1" data_type: {datatype} dims: [ 16 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
    """


MODELS: dict[str, Model] = {
    "pair": python_model(_pair("TYPE_INT32"), ZEROS),
    "strings": python_model(_pair("TYPE_STRING"), ZEROS),
    "fails": python_model(
        """
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
        """,
        FAILS,
    ),
}

# ---- malformed inputs -------------------------------------------------------------------------------------------


def _ints(count: int = 16) -> bytes:
    return np.arange(count, dtype=np.int32).tobytes()


def _raw(model: str, contents: dict[str, bytes], datatype: str = "INT32") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for name, raw in contents.items():
        request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        request.raw_input_contents.append(raw)
    return request


def _typed(counts: dict[str, tuple[str, int]]) -> pb.ModelInferRequest:
    """A request for "pair" with typed contents: {input: (contents field, how many values)}."""
    request = pb.ModelInferRequest(model_name="pair")
    for name, (field, count) in counts.items():
        getattr(request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents, field).extend(range(count))
    return request


def _strings(count: int) -> bytes:
    return b"".join(struct.pack("<I", 2) + b"%02d" % index for index in range(count))


def _requests() -> dict[str, tuple[pb.ModelInferRequest, str]]:
    """{case: (request, Triton's text the answer holds)}."""
    cases: dict[str, tuple[pb.ModelInferRequest, str]] = {
        "raw-byte-size": (
            _raw("pair", {"INPUT0": _ints(), "INPUT1": _ints(17)}),
            "input byte size mismatch for input 'INPUT1' for model 'pair'. Expected 64, got 68",
        ),
        "raw-byte-size-both": (  # Triton names the second of two; slotserve names each
            _raw("pair", {"INPUT0": _ints(15), "INPUT1": _ints(17)}),
            "input byte size mismatch for input 'INPUT1' for model 'pair'. Expected 64, got 68",
        ),
        "typed-count": (
            _typed({"INPUT0": ("int_contents", 16), "INPUT1": ("int_contents", 15)}),
            "input byte size mismatch for input 'INPUT1' for model 'pair'. Expected 64, got 60",
        ),
        "typed-wrong-field": (
            _typed({"INPUT0": ("fp32_contents", 16), "INPUT1": ("int_contents", 16)}),
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'pair' of type 'FP32', expected "
            "datatype 'INT32'",
        ),
        "typed-two-fields": (
            _typed({"INPUT0": ("int_contents", 16), "INPUT1": ("int_contents", 16)}),
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'pair', binary data was already "
            "supplied.",
        ),
        "raw-missing": (
            _raw("pair", {"INPUT0": _ints(), "INPUT1": _ints()}),
            "unable to find data for input tensor 'INPUT1' for model 'pair' in request.",
        ),
        "no-data": (
            _raw("pair", {"INPUT0": _ints(), "INPUT1": _ints()}),
            "unable to find data for input tensor 'INPUT0' for model 'pair' in request.",
        ),
        "duplicate": (
            _raw("pair", {"INPUT0": _ints(), "INPUT1": _ints()}),
            "input 'INPUT0' already exists in request",
        ),
        "bytes-fewer": (
            _raw("strings", {"INPUT0": _strings(15), "INPUT1": _strings(16)}, "BYTES"),
            "expected 16 string elements for inference input 'INPUT0' for model 'strings', got 15",
        ),
        "bytes-more": (
            _raw("strings", {"INPUT0": _strings(16), "INPUT1": _strings(17)}, "BYTES"),
            "unexpected number of string elements 17 for inference input 'INPUT1' for model 'strings', expecting 16",
        ),
        "bytes-cut-length": (
            _raw("strings", {"INPUT0": _strings(15) + b"\x02\x00", "INPUT1": _strings(16)}, "BYTES"),
            "incomplete string length indicator for inference input 'INPUT0' for model 'strings', expecting 4 bytes "
            "but only 2 bytes available. Please make sure the string length indicator is in one buffer.",
        ),
        "bytes-typed-fewer": (
            pb.ModelInferRequest(model_name="strings"),
            "expected 16 string elements for inference input 'INPUT0' for model 'strings', got 15",
        ),
    }
    typed = cases["typed-two-fields"][0]
    typed.inputs[0].contents.int64_contents.extend(range(16))
    del cases["raw-missing"][0].raw_input_contents[1]
    del cases["no-data"][0].raw_input_contents[:]
    duplicate = cases["duplicate"][0]
    duplicate.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    duplicate.raw_input_contents.append(_ints())
    strings = cases["bytes-typed-fewer"][0]
    for name, count in (("INPUT0", 15), ("INPUT1", 16)):
        tensor = strings.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        tensor.contents.bytes_contents.extend(b"%02d" % index for index in range(count))
    return cases


CASES = _requests()


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_input_is_refused_in_tritons_words(server, case):
    request, words = CASES[case]
    answer = server.send(request)
    assert answer.code == "INVALID_ARGUMENT", answer
    assert words in answer.message, answer.message
    if server.kind == "slotserve" and case != "raw-byte-size-both":
        assert answer.message.startswith(words), answer.message  # Triton's words first, then what slotserve adds


def test_each_malformed_input_is_named_by_slotserve_one_by_triton(server):
    request, _ = CASES["raw-byte-size-both"]
    answer = server.send(request)
    first = "input byte size mismatch for input 'INPUT0' for model 'pair'. Expected 64, got 60"
    assert (first in answer.message) == (server.kind == "slotserve"), answer.message


def test_an_extra_raw_entry_is_ignored_by_triton_and_refused_by_slotserve(server):
    """A deliberate difference (docs/errors.md): an entry no input takes is a client's mistake slotserve names."""
    request = _raw("pair", {"INPUT0": _ints(), "INPUT1": _ints()})
    request.raw_input_contents.append(_ints())
    answer = server.send(request)
    if server.kind == "triton":
        assert answer.ok, answer
    else:
        assert answer.code == "INVALID_ARGUMENT" and "raw_input_contents has 3 entries for 2 inputs" in answer.message


# ---- an execute that raises, the stream's triton_grpc_error mode --------------------------------------------------


def _fails(value: float) -> pb.ModelInferRequest:
    return build_request("fails", {"IN": np.array([value], np.float32)})


RAISED = "Failed to process the request(s) for model 'fails_0_0', message: ValueError: a negative input: -1.0"


def test_an_execute_that_raises_is_answered_in_tritons_words(server):
    answer = server.send(_fails(-1))
    assert answer.code == "INTERNAL", answer
    assert answer.message.startswith(RAISED), answer.message
    assert server.send(_fails(2)).ok  # the instance serves on


GRPC_ERROR = (("triton_grpc_error", "true"),)


def test_grpc_error_mode_answers_a_refused_request_on_the_stream_and_ends_at_a_run_error(server):
    with server.stream(metadata=GRPC_ERROR) as stream:
        refused = build_request("fails", {"IN": np.array([2], np.int32)})  # INT32 for FP32: refused before it runs
        stream.send(refused)
        item = stream.next()
        assert item is not None and item.error and "'IN'" in item.error, item
        stream.send(build_request("nowhere", {"IN": np.array([2], np.float32)}))
        item = stream.next()
        assert item is not None and "Request for unknown model: 'nowhere'" in item.error, item
        stream.send(_fails(2))
        item = stream.next()
        assert item is not None and item.error == "" and item.outputs["OUT"].tolist() == [2.0], item
        stream.send(_fails(-1))
        assert stream.next() is None  # the stream ended with the error's status
        code, message = stream.status
        assert code == "INTERNAL" and message.startswith(RAISED), stream.status
    assert server.send(_fails(2)).ok


def test_grpc_error_mode_ends_with_a_triton_errors_own_code(server):
    with server.stream(metadata=GRPC_ERROR) as stream:
        stream.send(_fails(1))
        assert stream.next() is None
        assert stream.status == ("INVALID_ARGUMENT", "told to fail"), stream.status


@pytest.mark.parametrize("value", ["True", "1", "yes"])
def test_grpc_error_mode_needs_the_value_true_exactly(server, value):
    with server.stream(metadata=(("triton_grpc_error", value),)) as stream:
        stream.send(_fails(1))
        item = stream.next()
        assert item is not None and item.error == "told to fail", item
        stream.send(_fails(2))
        item = stream.next()
        assert item is not None and item.error == "", item
        assert stream.status is None


# ---- loads that fail ----------------------------------------------------------------------------------------------

BROKEN = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this version is broken")
"""


def test_failed_loads_are_told_in_tritons_words(launch):
    """A version whose initialize raises, a configuration that does not read, files without `config`."""
    server = launch(
        {
            "garbled": Model("this is { not a configuration", {"1/model.py": "x = 1\n"}),
            "broken": python_model(
                """
                max_batch_size: 0
                input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
                output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
                """,
                BROKEN,
            ),
        },
        ("--model-control-mode=explicit",),
        model_control_mode="explicit",
    )
    code, message = server.load("broken")
    assert message.startswith("load failed for model 'broken': version 1 is at UNAVAILABLE state: "), message
    assert "RuntimeError: this version is broken" in message, message
    assert code == ("INVALID_ARGUMENT" if server.kind == "triton" else "FAILED_PRECONDITION"), (code, message)
    code, message = server.load("garbled")
    assert message.startswith("failed to load 'garbled', failed to poll from model repository"), message
    assert code == ("INTERNAL" if server.kind == "triton" else "INVALID_ARGUMENT"), (code, message)
    code, message = server.load("fresh", files={"file:1/model.py": b"x = 1\n"})
    assert (code, message.startswith("failed to load 'fresh', failed to poll from model repository")) == (
        "INTERNAL",
        True,
    ), message

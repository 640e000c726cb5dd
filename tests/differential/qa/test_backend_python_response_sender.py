"""L0_backend_python/response_sender, rewritten: a model told by its inputs how many responses to send through its
response sender before `execute` returns, whether to return one, how many to send afterwards (from a thread, or
from an asyncio task of an `async def execute`), and when to send the final flag; decoupled and not, batching and
not. The model's logic lives in `model_common.py` beside `model.py` (imported by name, as the QA's model does).
And response_sender_complete_final: a send after the final flag raises, in Triton's words."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np

from .harness import Model, build_request, python_model, wait_for

# Inputs (one row each, summed over the rows of a batched request): NUMBER_OF_RESPONSE_BEFORE_RETURN,
# SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN, RETURN_A_RESPONSE, NUMBER_OF_RESPONSE_AFTER_RETURN,
# SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN. Each response's INDEX tells when it was made: 0 returned, 1000+ before the
# return, 2000+ after it (0.5 s later, on a thread or an asyncio task).
MODEL_COMMON = """
    import asyncio
    import threading
    import time

    import numpy as np


    def _value(pb_utils, request, name):
        return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


    class Common:
        def __init__(self, pb_utils):
            self.pb_utils = pb_utils
            self.tasks = set()

        def plan(self, request):
            pb_utils = self.pb_utils
            returned = _value(pb_utils, request, "RETURN_A_RESPONSE")
            return {
                "rows": returned.shape[0],
                "return": bool(returned.sum()),
                "before": int(_value(pb_utils, request, "NUMBER_OF_RESPONSE_BEFORE_RETURN").sum()),
                "after": int(_value(pb_utils, request, "NUMBER_OF_RESPONSE_AFTER_RETURN").sum()),
                "final_before": bool(_value(pb_utils, request, "SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN").sum()),
                "final_after": bool(_value(pb_utils, request, "SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN").sum()),
            }

        def response(self, rows, index):
            tensor = self.pb_utils.Tensor("INDEX", np.array([[index]] * rows, np.uint16))
            return self.pb_utils.InferenceResponse(output_tensors=[tensor])

        def send(self, work, offset):
            for sender, rows, count, final in work:
                for index in range(count):
                    sender.send(self.response(rows, offset + index))
                if final:
                    sender.send(flags=self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        def later_on_thread(self, work):
            def run():
                time.sleep(0.5)  # ordering-free: the case passes either way; makes a send after return likely (as the QA)
                self.send(work, 2000)

            threading.Thread(target=run, daemon=True).start()

        def later_on_loop(self, work):
            async def run():
                await asyncio.sleep(0.5)  # ordering-free: the case passes either way; a send after return likely
                self.send(work, 2000)

            task = asyncio.create_task(run())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        def execute(self, requests, use_async):
            before, after, returned = [], [], []
            for request in requests:
                plan = self.plan(request)
                needed = plan["before"] or plan["after"] or plan["final_before"] or plan["final_after"]
                sender = request.get_response_sender() if needed else None
                before.append((sender, plan["rows"], plan["before"], plan["final_before"]))
                after.append((sender, plan["rows"], plan["after"], plan["final_after"]))
                returned.append(self.response(plan["rows"], 0) if plan["return"] else None)
            self.send(before, 1000)
            if use_async:
                self.later_on_loop(after)
            else:
                self.later_on_thread(after)
            if all(response is None for response in returned):
                return None
            return returned
"""

MODEL = """
    import triton_python_backend_utils as pb_utils
    from model_common import Common


    class TritonPythonModel:
        def initialize(self, args):
            self.common = Common(pb_utils)

        def execute(self, requests):
            return self.common.execute(requests, use_async=False)
"""

MODEL_ASYNC = """
    import triton_python_backend_utils as pb_utils
    from model_common import Common


    class TritonPythonModel:
        def initialize(self, args):
            self.common = Common(pb_utils)

        async def execute(self, requests):
            return self.common.execute(requests, use_async=True)
"""

CONFIG = """
    max_batch_size: 8
    input [
      { name: "NUMBER_OF_RESPONSE_BEFORE_RETURN" data_type: TYPE_UINT8 dims: [ 1 ] },
      { name: "SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN" data_type: TYPE_BOOL dims: [ 1 ] },
      { name: "RETURN_A_RESPONSE" data_type: TYPE_BOOL dims: [ 1 ] },
      { name: "NUMBER_OF_RESPONSE_AFTER_RETURN" data_type: TYPE_UINT8 dims: [ 1 ] },
      { name: "SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN" data_type: TYPE_BOOL dims: [ 1 ] }
    ]
    output [ { name: "INDEX" data_type: TYPE_UINT16 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""
DECOUPLED = "\nmodel_transaction_policy { decoupled: true }"
BATCHING = "\ndynamic_batching { max_queue_delay_microseconds: 500000 }"

# response_sender_complete_final: sends a response with the final flag, then another; what the second send raised
# is written into the model's folder.
COMPLETE_FINAL = """
    import os

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.folder = args["model_repository"]

        def execute(self, requests):
            for request in requests:
                out = pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
                response = pb_utils.InferenceResponse([out])
                sender = request.get_response_sender()
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                try:
                    sender.send(response)
                    raised = "nothing raised"
                except Exception as error:
                    raised = str(error)
                with open(os.path.join(self.folder, "raised.part"), "w") as marker:
                    marker.write(raised)
                os.replace(os.path.join(self.folder, "raised.part"), os.path.join(self.folder, "raised"))  # whole, at once
            return None
"""


def MODELS() -> dict[str, Model]:
    models = {}
    for name, config, source in (
        ("response_sender", CONFIG, MODEL),
        ("response_sender_decoupled", CONFIG + DECOUPLED, MODEL),
        ("response_sender_async", CONFIG, MODEL_ASYNC),
        ("response_sender_decoupled_async", CONFIG + DECOUPLED, MODEL_ASYNC),
        ("response_sender_batching", CONFIG + BATCHING, MODEL),
        ("response_sender_decoupled_batching", CONFIG + DECOUPLED + BATCHING, MODEL),
        ("response_sender_async_batching", CONFIG + BATCHING, MODEL_ASYNC),
        ("response_sender_decoupled_async_batching", CONFIG + DECOUPLED + BATCHING, MODEL_ASYNC),
    ):
        models[name] = python_model(config, source, extra={"model_common.py": MODEL_COMMON})
    models["response_sender_complete_final"] = python_model(
        """
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        instance_group [ { kind: KIND_CPU } ]
        model_transaction_policy { decoupled: true }
        """,
        COMPLETE_FINAL,
    )
    return models


def plan(before=0, final_before=False, returned=False, after=0, final_after=False) -> dict:
    return {
        "NUMBER_OF_RESPONSE_BEFORE_RETURN": np.array([[before]], np.uint8),
        "SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN": np.array([[final_before]], bool),
        "RETURN_A_RESPONSE": np.array([[returned]], bool),
        "NUMBER_OF_RESPONSE_AFTER_RETURN": np.array([[after]], np.uint8),
        "SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN": np.array([[final_after]], bool),
    }


ZERO_PRE = plan(final_before=True)
ZERO_POST = plan(final_after=True)
ONE_PRE = plan(before=1, final_before=True)
ONE_POST = plan(after=1, final_after=True)
TWO_PRE = plan(before=2, final_before=True)
TWO_POST = plan(after=2, final_after=True)
PRE_AND_POST = plan(before=1, after=3, final_after=True)
ONE_ON_RETURN = plan(returned=True)
ONE_PRE_AND_ON_RETURN = plan(before=1, final_before=True, returned=True)
ONE_ON_AND_POST_RETURN = plan(returned=True, after=1, final_after=True)


def infer(server, model: str, *plans: dict) -> list:
    """Send each plan as a request on one stream, end the stream, return every reply."""
    return server.stream_all([build_request(model, inputs) for inputs in plans])


def counts(items) -> tuple[int, bool, int]:
    """(responses before the return, whether one was returned, responses after it); every item must be a
    response, and at most one returned."""
    before, returned, after = 0, False, 0
    for item in items:
        assert not item.error, item.error
        index = float(item.outputs["INDEX"].sum()) / item.outputs["INDEX"].shape[0]
        if index < 1000:
            assert not returned, "more than one returned response"
            returned = True
        elif index < 2000:
            before += 1
        else:
            after += 1
    return before, returned, after


def expect(server, model: str, inputs: dict, before: int, returned: bool, after: int) -> None:
    assert counts(infer(server, model, inputs)) == (before, returned, after), model


def expect_error(server, model: str, inputs: dict, words: str) -> None:
    items = infer(server, model, inputs)
    assert len(items) == 1 and words in items[0].error, items


def decoupled_both(server, inputs, before, returned, after):
    expect(server, "response_sender_decoupled", inputs, before, returned, after)
    expect(server, "response_sender_decoupled_async", inputs, before, returned, after)


def test_decoupled_zero_response_pre_return(server):
    decoupled_both(server, ZERO_PRE, 0, False, 0)


def test_decoupled_zero_response_post_return(server):
    decoupled_both(server, ZERO_POST, 0, False, 0)


def test_decoupled_one_response_pre_return(server):
    decoupled_both(server, ONE_PRE, 1, False, 0)


def test_decoupled_one_response_post_return(server):
    decoupled_both(server, ONE_POST, 0, False, 1)


def test_decoupled_two_response_pre_return(server):
    decoupled_both(server, TWO_PRE, 2, False, 0)


def test_decoupled_two_response_post_return(server):
    decoupled_both(server, TWO_POST, 0, False, 2)


def test_decoupled_response_pre_and_post_return(server):
    decoupled_both(server, PRE_AND_POST, 1, False, 3)


def non_decoupled_both(server, inputs, before, returned, after):
    expect(server, "response_sender", inputs, before, returned, after)
    expect(server, "response_sender_async", inputs, before, returned, after)


def test_non_decoupled_one_response_on_return(server):
    non_decoupled_both(server, ONE_ON_RETURN, 0, True, 0)


def test_non_decoupled_one_response_pre_return(server):
    non_decoupled_both(server, ONE_PRE, 1, False, 0)


def test_non_decoupled_one_response_post_return(server):
    non_decoupled_both(server, ONE_POST, 0, False, 1)


MULTIPLE_DECOUPLED = [ZERO_PRE, ZERO_POST, ONE_PRE, ONE_POST, TWO_PRE, TWO_POST, PRE_AND_POST]


def test_decoupled_multiple_requests(server):
    """Seven requests on one stream to a batching decoupled model: 4 responses before the returns, 6 after."""
    for model in ("response_sender_decoupled_batching", "response_sender_decoupled_async_batching"):
        assert counts(infer(server, model, *MULTIPLE_DECOUPLED)) == (4, False, 6), model


def test_non_decoupled_multiple_requests(server):
    for model in ("response_sender_batching", "response_sender_async_batching"):
        assert counts(infer(server, model, ONE_ON_RETURN, ONE_PRE, ONE_POST)) == (1, True, 1), model


RETURN_NONE = "using the decoupled mode and the execute function must return None"


def test_decoupled_one_response_on_return(server):
    expect_error(server, "response_sender_decoupled", ONE_ON_RETURN, RETURN_NONE)


def test_decoupled_one_response_pre_and_on_return(server):
    """The response sent before the return arrives (and closes the sender); the returned one goes nowhere."""
    expect(server, "response_sender_decoupled", ONE_PRE_AND_ON_RETURN, 1, False, 0)


def test_decoupled_one_response_on_and_post_return(server):
    expect_error(server, "response_sender_decoupled", ONE_ON_AND_POST_RETURN, RETURN_NONE)


def test_non_decoupled_zero_response_pre_return(server):
    """A final flag without a response, on a model that is not decoupled: an error, in Triton's words."""
    words = "Non-decoupled model cannot send complete final before sending a response"
    expect_error(server, "response_sender", ZERO_PRE, words)
    expect_error(server, "response_sender_async", ZERO_PRE, words)


def test_non_decoupled_two_response_pre_return(server):
    """The first response reaches the client; the second send fails the model, and nothing more arrives."""
    expect(server, "response_sender", TWO_PRE, 1, False, 0)
    expect(server, "response_sender_async", TWO_PRE, 1, False, 0)


def test_non_decoupled_one_response_pre_and_on_return(server):
    expect(server, "response_sender", ONE_PRE_AND_ON_RETURN, 1, False, 0)
    expect(server, "response_sender_async", ONE_PRE_AND_ON_RETURN, 1, False, 0)


def test_non_decoupled_one_response_on_and_post_return(server):
    """The returned response arrives; the send after it fails in the model's thread, unseen by the client."""
    expect(server, "response_sender", ONE_ON_AND_POST_RETURN, 0, True, 0)
    expect(server, "response_sender_async", ONE_ON_AND_POST_RETURN, 0, True, 0)


def test_respond_after_complete_final(server):
    folder = server.repository / "response_sender_complete_final"
    (folder / "raised").unlink(missing_ok=True)
    value = np.array([[123.45]], np.float32)
    items = server.stream_all([build_request("response_sender_complete_final", {"INPUT0": value})])
    assert len(items) == 1 and not items[0].error and np.allclose(items[0].outputs["OUTPUT0"], value), items
    wait_for((folder / "raised").exists, "the model tried its second send")
    assert (folder / "raised").read_text() == "Unable to send response. Response sender has been closed."

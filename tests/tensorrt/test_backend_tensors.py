"""What a real engine's tensors can be, served or refused clearly (issue 15, items 2-5, and the batch dimension
of dynamic batching): scalars, non-linear I/O formats, host-side shape tensors, outputs whose shape only the data
decides, input shapes that do not fit each other, and the batch profile of a batching model. All over the test
double, which behaves as TensorRT does in each case (engine/testing/tensorrt_double/tensorrt_runtime.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import errors
from engine.config.specs import BatchingSpec
from engine.interface import CancelToken

from . import support
from .test_backend import check_add_sub, make_backend, run


def _served(model):
    return model, model.create_context()


def _close(model, *contexts):
    for context in contexts:
        context.close()
    model.close()


# ------------------------------------------------------------------------------------------------- scalars


def test_a_scalar_input_is_served_as_a_0_d_tensor(device, tmp_path):
    # silero_vad's `sr` is such an input: an INT64 scalar beside the audio.
    plan = device.write_plan(
        tmp_path / "vad" / "1" / "model.plan",
        inputs=[("audio", "FLOAT", (2, 3)), ("sr", "INT64", ())],
        outputs=[("audio_out", "FLOAT", (2, 3)), ("sr_out", "INT64", ())],
    )
    model, context = _served(make_backend(device).load(support.spec(plan, max_batch_size=0)))
    try:
        assert [(t.name, t.shape) for t in model.metadata.inputs] == [("audio", (2, 3)), ("sr", ())]
        audio = np.arange(6, dtype=np.float32).reshape(2, 3)
        result = run(context, {"audio": audio, "sr": np.array(16000, np.int64)})
        assert result["sr_out"].shape == () and result["sr_out"] == 16000
        np.testing.assert_array_equal(result["audio_out"], audio)
        with pytest.raises(errors.InvalidInputError, match=r"input 'sr' has shape \[1\]"):
            run(context, {"audio": audio, "sr": np.array([16000], np.int64)})
    finally:
        _close(model, context)
    assert device.leaks() == {}


# -------------------------------------------------------------------------------------------- I/O formats


@pytest.mark.parametrize("tensor_format,tensor", [("CHW16", "X"), ("HWC8", "X"), ("CHW4", "Y"), ("HWC", "X")])
def test_non_linear_io_formats_are_refused_at_load(device, tmp_path, tensor_format, tensor):
    shape = (1, 3, 8, 8)
    plan = device.write_plan(
        tmp_path / "fmt" / "1" / "model.plan",
        inputs=[("X", "HALF", shape)],
        outputs=[("Y", "HALF", shape)],
        formats={tensor: tensor_format},
    )
    with pytest.raises(errors.ModelConfigError) as caught:
        make_backend(device).load(support.spec(plan, max_batch_size=0))
    message = str(caught.value)
    assert f"'{tensor}'" in message and f"k{tensor_format}" in message and "linear" in message
    assert device.leaks() == {}


def test_a_linear_4_d_tensor_is_served(device, tmp_path):
    shape = (1, 3, 8, 8)
    plan = device.write_plan(
        tmp_path / "fmt" / "1" / "model.plan", inputs=[("X", "HALF", shape)], outputs=[("Y", "HALF", shape)]
    )
    model, context = _served(make_backend(device).load(support.spec(plan, max_batch_size=0)))
    try:
        value = np.random.default_rng(1).standard_normal(shape).astype(np.float16)
        np.testing.assert_array_equal(run(context, {"X": value})["Y"], value)
    finally:
        _close(model, context)


# ------------------------------------------------------------------------------------------- shape tensors


def test_shape_tensor_inputs_are_refused_at_load_by_name(device, tmp_path):
    plan = device.write_plan(
        tmp_path / "reshape" / "1" / "model.plan",
        inputs=[("X", "FLOAT", (4,)), ("new_shape", "INT64", (2,))],
        outputs=[("Y", "FLOAT", (4,))],
        host_tensors=("new_shape",),
    )
    with pytest.raises(errors.ModelConfigError, match=r"'new_shape' is a shape tensor"):
        make_backend(device).load(support.spec(plan, max_batch_size=0))
    assert device.leaks() == {}


# ----------------------------------------------------------------------------- data-dependent output shapes


def _nonzero_plan(device, tmp_path):
    return device.write_plan(
        tmp_path / "nonzero" / "1" / "model.plan",
        inputs=[("X", "FLOAT", (4, 4))],
        outputs=[("Y", "INT64", (2, -1))],
        function="nonzero",
        data_dependent={"Y": [1]},
    )


def test_data_dependent_outputs_are_served_through_an_output_allocator(device, tmp_path):
    model, context = _served(make_backend(device).load(support.spec(_nonzero_plan(device, tmp_path), max_batch_size=0)))
    try:
        assert [(t.name, t.shape) for t in model.metadata.outputs] == [("Y", (2, -1))]
        rng = np.random.default_rng(3)
        # The count of non-zero elements starts at zero (no buffer yet), goes up, down and to zero again: buffers
        # grow on demand and are reused.
        for density in (0.0, 0.2, 0.9, 0.0, 0.5, 1.0):
            x = (rng.random((4, 4)) < density).astype(np.float32)
            result = run(context, {"X": x})["Y"]
            np.testing.assert_array_equal(result, np.array(np.nonzero(x)))
            assert result.dtype == np.int64
    finally:
        _close(model, context)
    assert device.leaks() == {}


def test_a_data_dependent_output_of_a_model_built_from_onnx(device, tmp_path):
    onnx_path = support.write_nonzero_onnx(tmp_path)
    model, context = _served(make_backend(device, tmp_path).load(support.spec(onnx_path, max_batch_size=0)))
    try:
        x = np.zeros((4, 4), np.float32)
        x[1, 2] = x[3, 0] = 5
        np.testing.assert_array_equal(run(context, {"INPUT0": x})["OUTPUT0"], [[1, 3], [2, 0]])
    finally:
        _close(model, context)
    assert device.leaks() == {}


def test_a_caller_that_leaves_after_a_data_dependent_enqueue_loses_nothing(device, tmp_path):
    model, context = _served(make_backend(device).load(support.spec(_nonzero_plan(device, tmp_path), max_batch_size=0)))
    token = CancelToken()
    device.hooks.after_enqueue = token.cancel
    try:
        with pytest.raises(errors.ExecutionCancelled, match="result was dropped"):
            run(context, {"X": np.ones((4, 4), np.float32)}, cancel=token)
        device.hooks.after_enqueue = None
        x = np.eye(4, dtype=np.float32)
        np.testing.assert_array_equal(run(context, {"X": x})["Y"], np.array(np.nonzero(x)))
    finally:
        _close(model, context)
    assert device.leaks() == {}


# ------------------------------------------------------------------------------ shapes that do not fit


def test_input_shapes_that_do_not_fit_each_other_are_invalid_input(device, tmp_path):
    plan = support.write_add_sub_plan(device, tmp_path)
    model, context = _served(make_backend(device).load(support.spec(plan, max_batch_size=0)))
    try:
        inputs = {"INPUT0": np.zeros((2, 16), np.int32), "INPUT1": np.zeros((3, 16), np.int32)}
        with pytest.raises(errors.InvalidInputError) as caught:
            run(context, inputs)
        message = str(caught.value)
        assert "do not fit each other" in message and "'INPUT0' [2, 16]" in message and "'INPUT1' [3, 16]" in message
        assert device.stats.enqueues == 0  # refused before anything was queued
        good = support.add_sub_inputs(5, batch=3)
        check_add_sub(run(context, good), good)  # the slot is still good
    finally:
        _close(model, context)
    assert device.leaks() == {}


# ------------------------------------------------------------------------------------- the batch dimension


@pytest.mark.parametrize(
    "batching,opt", [(BatchingSpec(preferred_batch_sizes=(2, 4)), 4), (BatchingSpec(), 8), (None, 8)]
)
def test_a_batching_model_builds_its_batch_profile_from_the_preferred_sizes(device, tmp_path, batching, opt):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    model, context = _served(make_backend(device, tmp_path).load(support.spec(onnx_path, batching=batching)))
    try:
        assert model.profile_shapes("INPUT0") == ((1, 16), (opt, 16), (8, 16))
        # The server hands the slot one stacked array per input; its first dimension is the batch of this run.
        for batch in (1, 3, 8, 2):
            inputs = support.add_sub_inputs(batch, batch=batch)
            check_add_sub(run(context, inputs), inputs)
        with pytest.raises(errors.InvalidInputError, match=r"from \[1, 16\] to \[8, 16\]"):
            run(context, support.add_sub_inputs(9, batch=9))
    finally:
        _close(model, context)
    assert device.leaks() == {}


def test_the_opt_batch_size_parameter_still_wins(device, tmp_path):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    model = make_backend(device, tmp_path).load(
        support.spec(onnx_path, batching=BatchingSpec(preferred_batch_sizes=(4,)), trt_opt_batch_size="2")
    )
    try:
        assert model.profile_shapes("INPUT0")[1] == (2, 16)
    finally:
        model.close()

"""The plan cache key covers everything a plan depends on (issue 15, item 9): the GPU's compute capability (what
TensorRT checks), the CUDA major version TensorRT was built for, and the ONNX model's external data files (its
weights, for large models)."""

from __future__ import annotations

import numpy as np

from engine.tensorrt import backend as backend_module
from engine.testing.tensorrt_double import FakeDevice

from . import support
from .test_backend import make_backend, run


def test_two_gpus_of_one_name_and_another_compute_capability_keep_their_own_plans(tmp_path):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    hopper = FakeDevice(name="NVIDIA GPU", compute_capability=(9, 0))
    ampere = FakeDevice(name="NVIDIA GPU", compute_capability=(8, 6))
    model_spec = support.spec(onnx_path)
    for device in (hopper, ampere):
        model = make_backend(device, tmp_path).load(model_spec)
        assert model.plan_source == "built"
        model.close()
    for device in (hopper, ampere):  # each finds its own plan: neither discarded the other's
        model = make_backend(device, tmp_path).load(model_spec)
        assert model.plan_source == "cache"
        model.close()
    assert len(list((tmp_path / "plan-cache").glob("*.plan"))) == 2


def test_tensorrt_built_for_another_cuda_major_gets_its_own_plan(device, tmp_path, monkeypatch):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    monkeypatch.setattr(backend_module, "tensorrt_cuda_major", lambda module: 12)
    make_backend(device, tmp_path).load(support.spec(onnx_path)).close()
    monkeypatch.setattr(backend_module, "tensorrt_cuda_major", lambda module: 13)
    model = make_backend(device, tmp_path).load(support.spec(onnx_path))
    assert model.plan_source == "built"
    model.close()


def test_changed_external_weights_rebuild_the_plan(device, tmp_path):
    onnx_path = support.write_scaled_onnx_with_external_weights(tmp_path, scale=2.0)
    assert (onnx_path.parent / "weights.bin").exists()
    x = np.arange(4, dtype=np.float32)
    for scale, source in ((2.0, "built"), (2.0, "cache"), (3.0, "built")):
        # model.onnx stays byte for byte the same; only the weights beside it change.
        (onnx_path.parent / "weights.bin").write_bytes(np.full(4, scale, np.float32).tobytes())
        model = make_backend(device, tmp_path).load(support.spec(onnx_path, max_batch_size=0))
        context = model.create_context()
        try:
            assert model.plan_source == source
            np.testing.assert_array_equal(run(context, {"INPUT0": x})["OUTPUT0"], x * scale)
        finally:
            context.close()
            model.close()
    assert device.leaks() == {}


def test_the_cuda_major_of_the_installed_tensorrt_comes_from_its_distribution():
    lean = __import__("importlib").import_module("tensorrt_lean")
    # requirements-dev.txt installs tensorrt-lean-cu13; the test double's modules belong to no distribution.
    assert backend_module.tensorrt_cuda_major(lean) == 13
    assert backend_module.tensorrt_cuda_major(FakeDevice().trt) is None

"""A TensorRT model whose model.plan is replaced serves the new plan after a reload (issue 33, item 3), on the
test double: a plan computing the identity is replaced by one computing add/sub over the same tensors, then the model
is loaded again (RepositoryModelLoad, or a scan in poll mode). The old code kept the engine (the path was the same)
and went on answering with the identity. A reload with the plan unchanged keeps the engine."""

from __future__ import annotations

import numpy as np
import pytest

from engine.tensorrt import TensorRTBackend
from service.testing import serve

from . import support

HOUR = 3600.0
CALL_TIMEOUT = 60.0


def write_plan(device, repository, function: str) -> None:
    device.write_plan(
        repository / "trt" / "1" / "model.plan",
        inputs=support.ADD_SUB_INPUTS,
        outputs=support.ADD_SUB_OUTPUTS,
        function=function,
        profiles=support.add_sub_profiles(),
    )


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_a_replaced_plan_is_served_after_a_reload(tmp_path, device, mode):
    repository = tmp_path / "models"
    write_plan(device, repository, "identity")
    (repository / "trt" / "config.pbtxt").write_text(
        f'name: "trt"\nplatform: "tensorrt_plan"\nmax_batch_size: {support.BATCH}\n'
        'parameters { key: "trt_memory_reserve_bytes" value { string_value: "0" } }\n'
    )
    backend = TensorRTBackend(
        trt_module=device.trt,
        cudart_module=device.cudart,
        cuda_utils_module=device.cuda_utils,
        cache_dir=tmp_path / "plan-cache",
    )
    inputs = support.add_sub_inputs(seed=3)
    with serve(
        repository,
        backends={"tensorrt": backend},
        model_control_mode=mode,
        load_models=("*",) if mode == "explicit" else (),
        repository_poll_seconds=HOUR,
        allow_management=True,
    ) as running:

        def reload() -> None:
            if mode == "poll":
                assert running.server.control.poll_once()["loaded"] == ["trt"]
            else:
                running.client.load("trt", timeout=CALL_TIMEOUT)

        assert np.array_equal(running.client.infer("trt", inputs)["OUTPUT0"], inputs["INPUT0"])
        events = running.server.registry.runtime.events
        if mode == "explicit":  # unchanged: reconfigured in place, the same engine answers (nothing loaded)
            before = events.counts()
            reload()
            assert np.array_equal(running.client.infer("trt", inputs)["OUTPUT0"], inputs["INPUT0"])
            after = events.counts()
            assert after[("reconfigured", "trt")] == before[("reconfigured", "trt")] + 1
            assert after[("loaded", "trt")] == before[("loaded", "trt")]
        loaded = events.counts()[("loaded", "trt")]
        write_plan(device, repository, "add_sub")
        reload()
        assert events.counts()[("loaded", "trt")] == loaded + 1  # a new engine
        outputs = running.client.infer("trt", inputs)
        assert np.array_equal(outputs["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
        assert np.array_equal(outputs["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])
        assert running.client.model_ready("trt")

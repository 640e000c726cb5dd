"""The rate limiter, asked of real Triton 2.51 (issue 38; docs/lifecycle.md, "Rate limiter").

Python models whose `execute` a test holds at a file gate (tests/lifecycle_models.py), with an instance_group
`rate_limiter`. Both servers get the same repository and the same calls:

* two models sharing a resource of count 1 (the default availability: the most any model needs) never run at
  once under `--rate-limit execution_count`: while the first is held in execute the second never reaches its own
  execute; it runs once the first ends. With `--rate-limit off` (the default) both run at once;
* `--rate-limit-resource R:2` lets both run at once;
* load-time errors: a model needing more than `--rate-limit-resource` gives (Triton's words, in the load's
  error), or naming a resource global where a loaded model has it per device.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.core.rate_limiter import RateLimitMode, ResourceFlag
from tests.lifecycle_models import Gates, write_gated_model

pytestmark = pytest.mark.interop

CALL = 60.0
WATCHED = 2.0  # seconds the second model is watched not running while the first holds the resource


def _group(resources: str) -> str:
    return f"instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ resources [ {resources} ] }} }} ]\n"


def _pair(root: Path, resources: str = '{ name: "R" count: 1 }') -> tuple[Gates, Gates]:
    gates = []
    for name in ("a", "b"):
        model_gates = Gates(root.parent / f"{root.name}-gates-{name}")
        write_gated_model(root, name, model_gates.folder, extra=_group(resources))
        gates.append(model_gates)
    return gates[0], gates[1]


def _request(model: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="X", datatype="FP32", shape=[4])
    request.raw_input_contents.append(np.ones(4, "f").tobytes())
    return request


def _infer_in_background(stub, model: str, outcomes: list[str]) -> threading.Thread:
    def call() -> None:
        try:
            stub.ModelInfer(_request(model), timeout=CALL)
            outcomes.append("OK")
        except grpc.RpcError as error:
            outcomes.append(f"{error.code().name}: {error.details()}")

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def _runs_at_once(stub, a: Gates, b: Gates) -> bool:
    """Hold both models in execute, call a then b: whether b reached execute while a was held there."""
    outcomes: list[str] = []
    a.hold("execute")
    b.hold("execute")
    threads = []
    try:
        threads.append(_infer_in_background(stub, "a", outcomes))
        a.wait_arrivals("execute", 1)
        threads.append(_infer_in_background(stub, "b", outcomes))
        watched_until = time.monotonic() + WATCHED
        at_once = False
        while time.monotonic() < watched_until and not at_once:
            at_once = bool(b.arrived("execute"))
            time.sleep(0.05)  # ordering-free: samples an observable state over a stretch of time
        a.release("execute")
        b.wait_arrivals("execute", 1)  # b runs once a ended, in every case
    finally:
        a.release_all()
        b.release_all()
        for thread in threads:
            thread.join(CALL)
    assert outcomes == ["OK", "OK"], outcomes
    return at_once


@pytest.mark.parametrize(
    "mode, flags, at_once",
    [
        ("execution_count", (), False),
        ("off", (), True),
        ("execution_count", ("R:2",), True),
    ],
)
def test_two_models_sharing_a_resource_of_one_serialize(triton, slotserve_endpoint, tmp_path, mode, flags, at_once):
    args = [f"--rate-limit={mode}", *(f"--rate-limit-resource={flag}" for flag in flags)]
    a, b = _pair(tmp_path / "triton")
    reference = triton(tmp_path / "triton", *args)
    assert _runs_at_once(reference.stub, a, b) is at_once

    a, b = _pair(tmp_path / "slotserve")
    ours = slotserve_endpoint(
        tmp_path / "slotserve",
        rate_limit=RateLimitMode(mode),
        rate_limit_resources=tuple(ResourceFlag(f.split(":")[0], int(f.split(":")[1])) for f in flags),
    )
    assert _runs_at_once(ours.stub, a, b) is at_once


def _load(stub, name: str) -> tuple[str, str]:
    try:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name), timeout=CALL)
        return "OK", ""
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""


def test_a_model_needing_more_than_the_flag_gives_fails_to_load(triton, slotserve_endpoint, tmp_path):
    says = (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more model instances, '
        "the minimum required count is 4"
    )
    for side in ("triton", "slotserve"):
        write_gated_model(tmp_path / side, "greedy", tmp_path / "gates", extra=_group('{ name: "R" count: 4 }'))
        write_gated_model(tmp_path / side, "modest", tmp_path / "gates", extra=_group('{ name: "R" count: 1 }'))
    reference = triton(
        tmp_path / "triton",
        "--model-control-mode=explicit",
        "--rate-limit=execution_count",
        "--rate-limit-resource=R:1",
    )
    code, details = _load(reference.stub, "greedy")
    assert code == "INVALID_ARGUMENT" and says in details, (code, details)
    assert _load(reference.stub, "modest") == ("OK", "")

    ours = slotserve_endpoint(
        tmp_path / "slotserve",
        model_control_mode="explicit",
        rate_limit=RateLimitMode.EXECUTION_COUNT,
        rate_limit_resources=(ResourceFlag("R", 1),),
    )
    code, details = _load(ours.stub, "greedy")
    assert code == "FAILED_PRECONDITION" and says in details, (code, details)  # a load's failure (docs/errors.md)
    assert _load(ours.stub, "modest") == ("OK", "")


def test_a_resource_global_in_one_model_and_per_device_in_another_fails_the_second_load(
    triton, slotserve_endpoint, tmp_path
):
    says = 'Resource "R" is present as both global and device-specific resource in the model configuration.'
    for side in ("triton", "slotserve"):
        write_gated_model(
            tmp_path / side, "shared", tmp_path / "gates", extra=_group('{ name: "R" global: true count: 1 }')
        )
        write_gated_model(tmp_path / side, "local", tmp_path / "gates", extra=_group('{ name: "R" count: 1 }'))
    reference = triton(tmp_path / "triton", "--model-control-mode=explicit", "--rate-limit=execution_count")
    assert _load(reference.stub, "shared") == ("OK", "")
    code, details = _load(reference.stub, "local")
    assert code == "INVALID_ARGUMENT" and says in details, (code, details)

    ours = slotserve_endpoint(
        tmp_path / "slotserve", model_control_mode="explicit", rate_limit=RateLimitMode.EXECUTION_COUNT
    )
    assert _load(ours.stub, "shared") == ("OK", "")
    code, details = _load(ours.stub, "local")
    assert code == "FAILED_PRECONDITION" and says in details, (code, details)


@pytest.mark.parametrize("flag", ["Q:1", "Q:1:1", "r:5"])
def test_once_a_flag_is_given_a_per_device_resource_it_does_not_give_has_none(
    triton, slotserve_endpoint, tmp_path, flag
):
    """Asked of Triton (its docs say the default is the most any instance needs, and call the flag's values
    case-insensitive): with any --rate-limit-resource, a resource the flags do not give has 0 copies, a global one
    too (a flag for device 1 only, or naming "r" for a model's "R", gives none); the model fails to load."""
    for side in ("triton", "slotserve"):
        write_gated_model(tmp_path / side, "dev", tmp_path / "gates", extra=_group('{ name: "R" count: 4 }'))
        write_gated_model(
            tmp_path / side, "glob", tmp_path / "gates", extra=_group('{ name: "G" global: true count: 2 }')
        )
    says = 'Resource count for "R" is limited to 0 which will prevent scheduling'
    reference = triton(
        tmp_path / "triton",
        "--model-control-mode=explicit",
        "--rate-limit=execution_count",
        f"--rate-limit-resource={flag}",
    )
    code, details = _load(reference.stub, "dev")
    assert code == "INVALID_ARGUMENT" and says in details, (code, details)
    code, details = _load(reference.stub, "glob")
    assert code == "INVALID_ARGUMENT" and 'Resource count for "G" is limited to 0' in details, (code, details)
    name, count, *device = flag.split(":")
    ours = slotserve_endpoint(
        tmp_path / "slotserve",
        model_control_mode="explicit",
        rate_limit=RateLimitMode.EXECUTION_COUNT,
        rate_limit_resources=(ResourceFlag(name, int(count), int(device[0]) if device else None),),
    )
    code, details = _load(ours.stub, "dev")
    assert code == "FAILED_PRECONDITION" and says in details, (code, details)
    code, details = _load(ours.stub, "glob")
    assert code == "FAILED_PRECONDITION" and 'Resource count for "G" is limited to 0' in details, (code, details)

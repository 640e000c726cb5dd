"""Model versions on a real server (issue 21 part 2): a fixture model with version folders 1, 2 and 3 serves the
versions its `version_policy` selects, each its own pool; a request naming no version goes to the highest READY
one; ModelReady, ModelMetadata, ModelConfig, ModelStatistics and RepositoryIndex answer per version; a reload
that changes the policy adds and retires versions while the kept one serves; unload takes every version;
--max-resident-models counts each version."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from service.testing import serve

from .._support import CALL_TIMEOUT, rpc_error, stub, write_fixture_model

cell = pytest.mark.cell

INPUTS = [("X", "FP32", [4])]
OUTPUTS = [("Y", "FP32", [4])]
X = np.arange(4, dtype=np.float32)


def write_versioned(root, policy: str = "", folders=(1, 2, 3)):
    directory = write_fixture_model(root, "m", inputs=INPUTS, outputs=OUTPUTS, extra=policy)
    for version in folders:
        (directory / str(version)).mkdir(exist_ok=True)
    return directory


def request(version: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version=version)
    message.inputs.add(name="X", datatype="FP32", shape=[4])
    message.raw_input_contents.append(X.tobytes())
    return message


def answered_by(running, version: str = "") -> str:
    """The version that answered a request naming `version` (checked to have computed the answer)."""
    response = stub(running).ModelInfer(request(version), timeout=CALL_TIMEOUT)
    assert np.frombuffer(response.raw_output_contents[0], dtype="<f4").tolist() == X.tolist()
    return response.model_version


def index_rows(running) -> list[tuple[str, str]]:
    return [(m.version, m.state) for m in running.client.repository_index() if m.name == "m"]


@pytest.mark.parametrize(
    "policy, served",
    [
        ("", ["3"]),
        ("version_policy { latest { num_versions: 2 } }", ["2", "3"]),
        ("version_policy { all { } }", ["1", "2", "3"]),
        ("version_policy { specific { versions: [ 1 ] } }", ["1"]),
        ("version_policy { specific { versions: [ 1, 3 ] } }", ["1", "3"]),
    ],
)
@cell("VERSION.01", "VERSION.03")
def test_each_policy_serves_its_versions_and_each_answers_for_itself(tmp_path, policy, served):
    write_versioned(tmp_path, policy)
    with serve(tmp_path) as running:
        assert index_rows(running) == [(v, "READY") for v in served]
        for version in ("1", "2", "3"):
            assert running.client.model_ready("m", version) is (version in served), version
            if version in served:
                assert answered_by(running, version) == version
                assert list(running.client.model_metadata("m", version).versions) == [version]
                assert running.client.model_config("m", version).name == "m"
            else:
                error = rpc_error(stub(running).ModelInfer, request(version))
                assert (error.code, error.reason) == ("NOT_FOUND", "model_not_found"), error
                assert f"'m' version {version} is not found" in error.message
        assert answered_by(running) == served[-1]  # no version: the highest ready one
        assert running.client.model_ready("m") is True
        assert list(running.client.model_metadata("m").versions) == served  # every ready version, as Triton


@cell("VERSION.02", "VERSION.03")
def test_no_version_goes_to_the_highest_ready_version_and_each_version_loads_on_its_own(tmp_path):
    write_versioned(tmp_path, "version_policy { all { } }")
    with serve(tmp_path, load_at_startup=False) as running:
        assert index_rows(running) == [("1", "UNAVAILABLE"), ("2", "UNAVAILABLE"), ("3", "UNAVAILABLE")]
        assert running.client.model_ready("m") is False
        assert answered_by(running, "1") == "1"  # loads version 1 alone
        assert index_rows(running) == [("1", "READY"), ("2", "UNAVAILABLE"), ("3", "UNAVAILABLE")]
        assert answered_by(running) == "1"  # the highest READY version, not the highest folder
        assert list(running.client.model_metadata("m").versions) == ["1"]
        assert answered_by(running, "3") == "3"
        assert answered_by(running) == "3"
        assert list(running.client.model_metadata("m").versions) == ["1", "3"]


@cell("VERSION.02")
def test_with_no_version_ready_a_request_loads_the_highest(tmp_path):
    write_versioned(tmp_path, "version_policy { latest { num_versions: 2 } }")
    with serve(tmp_path, load_at_startup=False) as running:
        assert answered_by(running) == "3"
        assert index_rows(running) == [("2", "UNAVAILABLE"), ("3", "READY")]


@cell("VERSION.04")
def test_statistics_per_version_and_for_every_version_when_none_is_named(tmp_path):
    write_versioned(tmp_path, "version_policy { all { } }")
    with serve(tmp_path) as running:
        for version in ("1", "1", "3"):
            answered_by(running, version)
        every = {s.version: s.inference_count for s in running.client.statistics("m")}
        assert every == {"1": 2, "2": 0, "3": 1}
        one = running.client.statistics("m", "1")
        assert [(s.name, s.version, s.inference_count) for s in one] == [("m", "1", 2)]
        assert {(s.name, s.version) for s in running.client.statistics()} >= {("m", "1"), ("m", "2"), ("m", "3")}


@cell("VERSION.06", "VERSION.03")
def test_unload_retires_every_version_and_a_request_loads_them_again(tmp_path):
    write_versioned(tmp_path, "version_policy { all { } }")
    with serve(tmp_path, allow_management=True) as running:
        listed = [(s.model_id, s.version, s.state) for s in running.management.list()]
        assert listed == [("m", "1", "READY"), ("m", "2", "READY"), ("m", "3", "READY")]
        running.management.unload("m")
        assert index_rows(running) == [("1", "UNAVAILABLE"), ("2", "UNAVAILABLE"), ("3", "UNAVAILABLE")]
        assert not any(running.client.model_ready("m", v) for v in ("", "1", "2", "3"))
        running.client.load("m")  # Triton's RepositoryModelLoad: every version again
        assert index_rows(running) == [("1", "READY"), ("2", "READY"), ("3", "READY")]


@cell("VERSION.06")
def test_bulk_unload_takes_every_version(tmp_path):
    write_versioned(tmp_path, "version_policy { latest { num_versions: 2 } }")
    with serve(tmp_path, allow_management=True) as running:
        unloaded, not_found = running.management.unload_many(["m"])
        assert (unloaded, not_found) == (["m"], [])
        assert index_rows(running) == [("2", "UNAVAILABLE"), ("3", "UNAVAILABLE")]


@cell("VERSION.05")
def test_a_reload_that_changes_the_policy_adds_and_retires_versions_while_the_kept_one_serves(tmp_path, controls):
    directory = write_versioned(tmp_path, "version_policy { specific { versions: [ 2 ] } }")
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}, allow_management=True) as running:
        assert index_rows(running) == [("2", "READY")]
        assert controls.count("m", "load") == 1
        write_versioned(tmp_path, "version_policy { specific { versions: [ 2, 3 ] } }")
        gate = controls.gate("m", "load").hold()  # the added version's load waits here
        failures: list[BaseException] = []

        def reload() -> None:
            try:
                running.client.load("m")
            except BaseException as error:  # reported by the test below
                failures.append(error)

        thread = threading.Thread(target=reload)
        thread.start()
        try:
            gate.wait_arrivals(2)  # the startup load was the first arrival
            assert running.client.model_ready("m", "3") is False
            assert running.client.model_ready("m", "2") is True
            assert answered_by(running) == "2"  # the kept version serves through the reload
            assert answered_by(running, "2") == "2"
        finally:
            gate.release()
            thread.join(timeout=30)
        assert not thread.is_alive() and failures == []
        assert index_rows(running) == [("2", "READY"), ("3", "READY")]
        assert answered_by(running) == "3"

        (directory / "config.pbtxt").write_text(
            (directory / "config.pbtxt").read_text().replace("versions: [ 2, 3 ]", "versions: [ 3 ]")
        )
        engines = controls.count("m", "load")
        running.client.load("m")  # drops version 2, keeps version 3 as it is
        assert index_rows(running) == [("3", "READY")]
        assert controls.count("m", "load") == engines  # the kept version was not reloaded
        error = rpc_error(stub(running).ModelInfer, request("2"))
        assert (error.code, error.reason) == ("NOT_FOUND", "model_not_found"), error
        assert running.client.model_ready("m", "2") is False
        assert answered_by(running) == "3"
        assert controls.live_engines("m") == 1  # version 2's engine was closed


@cell("VERSION.07")
def test_residency_counts_each_version(tmp_path):
    write_versioned(tmp_path, "version_policy { all { } }")
    with serve(tmp_path, load_at_startup=False, max_resident_models=2) as running:
        assert answered_by(running, "1") == "1"
        assert answered_by(running, "2") == "2"
        assert answered_by(running, "3") == "3"  # evicts the least recently used version, 1
        assert index_rows(running) == [("1", "UNAVAILABLE"), ("2", "READY"), ("3", "READY")]

"""tritonclient[grpc] (2.73) against slotserve, from a separate process (clients/tritonclient_cases.py).

Each test starts its own in-process server and runs one case of the client script; the script asserts and
prints what it saw, and the test checks that again here (values recomputed with numpy, never hard-coded).
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from engine.config.repository import ModelRepository

pytestmark = pytest.mark.interop

SCRIPT = "tritonclient_cases.py"


def check_sum_diff(entry: dict) -> None:
    a = np.asarray(entry["INPUT0"], dtype=np.int32)
    b = np.asarray(entry["INPUT1"], dtype=np.int32)
    assert a.size > 0 and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(entry["OUTPUT0"], dtype=np.int32), a + b)
    np.testing.assert_array_equal(np.asarray(entry["OUTPUT1"], dtype=np.int32), a - b)


def repository_names(repository) -> list[str]:
    return sorted(path.parent.name for path in repository.glob("*/config.pbtxt"))


@pytest.fixture
def server(slotserve, demo_repository):
    return slotserve(demo_repository, parallel_jobs=2)


# Triton's words for each failed load (docs/errors.md): an override that does not read and a model the repository
# lacks fail its poll; an override the model file refuses fails the version's load.
TRITONS_LOAD_WORDS = {
    "not_json": "failed to load 'simple', failed to poll from model repository: ",
    "unknown_model": "failed to load 'no_such_model', failed to poll from model repository: ",
    "unknown_input": "load failed for model 'simple': version 1 is at UNAVAILABLE state: ",
}


def test_pytest_process_never_imports_tritonclient():
    # The premise of every test here: tritonclient's .proto copies would clash with slotserve's generated code.
    assert not any(name == "tritonclient" or name.startswith("tritonclient.") for name in sys.modules)


def test_sync_infer_raw(server, run_client):
    result = run_client(SCRIPT, server.address, "infer")
    check_sum_diff(result["full"])
    assert np.asarray(result["full"]["INPUT0"]).shape == (3, 16)
    assert result["id"] == "sync-1"
    assert result["model_version"] == "1"
    assert result["only_outputs"] == ["OUTPUT1"]
    np.testing.assert_array_equal(
        result["only_OUTPUT1"],
        np.asarray(result["full"]["INPUT0"], np.int32) - np.asarray(result["full"]["INPUT1"], np.int32),
    )


def test_sync_infer_gzip_and_deflate_compressed(server, run_client):
    result = run_client(SCRIPT, server.address, "compressed")
    assert sorted(result) == ["deflate", "gzip"]
    for entry in result.values():
        check_sum_diff(entry)


def test_async_infer_with_callback(server, run_client):
    result = run_client(SCRIPT, server.address, "async")
    assert sorted(result) == [f"async-{i}" for i in range(4)]
    for index, entry in enumerate(result[f"async-{i}"] for i in range(4)):
        assert np.asarray(entry["INPUT0"]).shape == (index + 1, 16)
        check_sum_diff(entry)


def test_aio_infer(server, run_client):
    result = run_client(SCRIPT, server.address, "aio")
    assert sorted(result) == ["aio-0", "aio-1", "aio-2"]
    for entry in result.values():
        check_sum_diff(entry)


def test_typed_int_contents_through_raw_stubs(server, run_client):
    result = run_client(SCRIPT, server.address, "explicit_int")
    assert result["id"] == "typed-1"
    check_sum_diff(result)


def test_bytes_round_trip_on_simple_identity(server, run_client):
    result = run_client(SCRIPT, server.address, "bytes")
    assert result["received"] == result["sent"]
    assert "" in result["sent"] and any(len(text) >= 1000 for text in result["sent"])


def test_stream_infer_error_for_one_request_only(server, run_client):
    result = run_client(SCRIPT, server.address, "stream")
    responses = result["responses"]
    assert [entry["id"] for entry in responses] == [f"stream-{i}" for i in range(5)]
    failed = responses[2]
    assert set(failed) == {"id", "error"}
    assert "INPUT0" in failed["error"] and "FP32" in failed["error"], failed["error"]
    for entry in responses[:2] + responses[3:]:
        assert "error" not in entry
        check_sum_diff(entry)
    echo = result["error_id_echo"]
    assert echo["error_id"] == "raw-bad" and echo["ok_id"] == "raw-ok"
    assert echo["error_message"]


def test_get_model_config(server, run_client, demo_repository):
    config = run_client(SCRIPT, server.address, "config")["config"]
    spec = ModelRepository(demo_repository).read("simple")
    assert config["name"] == "simple"
    assert config["max_batch_size"] == spec.max_batch_size == 8
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == [
        (t.name, "TYPE_" + t.datatype, list(t.shape)) for t in spec.inputs
    ]
    assert [t["name"] for t in config["output"]] == [t.name for t in spec.outputs]
    # Slots are reported as instance_group[0].count; the server runs --parallel-jobs 2 and simple sets none.
    assert config["instance_group"][0]["count"] == server.management.get("simple").slots == 2
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_get_inference_statistics_counts_exactly_the_requests(server, run_client, demo_repository):
    result = run_client(SCRIPT, server.address, "statistics")
    before, after, batches = result["before"], result["after"], result["batches"]

    def count(entry, field):
        return int(entry["inference_stats"].get(field, {}).get("count", 0))

    def ns(entry, field):
        return int(entry["inference_stats"].get(field, {}).get("ns", 0))

    assert result["failed"] == 1
    assert count(after, "success") - count(before, "success") == len(batches)
    assert count(after, "fail") - count(before, "fail") == result["failed"]
    for field in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert field in after["inference_stats"], field
        assert count(after, field) - count(before, field) == len(batches), field
    assert ns(after, "success") > ns(before, "success")
    assert ns(after, "compute_infer") > ns(before, "compute_infer")
    assert int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)) == sum(batches)
    assert int(after.get("execution_count", 0)) - int(before.get("execution_count", 0)) == len(batches)
    assert (
        int(after.get("last_inference", 0)) >= int(before.get("last_inference", 0)) and int(after["last_inference"]) > 0
    )
    assert result["all_models"] == repository_names(demo_repository)


def test_get_model_repository_index(server, run_client, demo_repository):
    models = run_client(SCRIPT, server.address, "index")["models"]
    assert sorted(m["name"] for m in models) == repository_names(demo_repository)
    for model in models:
        assert model["state"] == "READY", model
        assert model["version"] == "1", model


def test_load_unload_ready_and_config_override(slotserve, run_client, demo_repository, tmp_path):
    repository = tmp_path / "repository"
    shutil.copytree(demo_repository / "simple", repository / "simple")
    on_disk = (repository / "simple" / "config.pbtxt").read_bytes()
    configured = ModelRepository(repository).read("simple").max_batch_size
    override = 4
    assert configured != override
    server = slotserve(repository, parallel_jobs=2, allow_management=True)

    steps = run_client(SCRIPT, server.address, "control")

    assert steps["ready_at_start"] is True and steps["mbs_at_start"] == configured
    assert steps["ready_after_unload"] is False
    assert steps["index_after_unload"] == {"simple": "UNAVAILABLE"}
    assert steps["ready_after_load"] is True
    assert steps["ready_after_override"] is True
    assert steps["mbs_after_override"] == override
    assert steps["batch_5_after_override"] == "StatusCode.INVALID_ARGUMENT"
    assert sorted(steps["failed_loads"]) == ["not_json", "unknown_input", "unknown_model"]
    for label, error in steps["failed_loads"].items():
        assert error is not None, f"{label}: the load succeeded"
        assert error["message"].startswith(TRITONS_LOAD_WORDS[label]), (label, error)
    # A load without an override reads the repository's configuration again.
    assert steps["ready_after_reload"] is True and steps["mbs_after_reload"] == configured
    assert steps["ready_at_end"] is False
    # The override lives in the server, not in the repository.
    assert (repository / "simple" / "config.pbtxt").read_bytes() == on_disk


def test_failed_reload_keeps_the_serving_model(slotserve, run_client, demo_repository, tmp_path):
    """Triton's explicit model control (docs/user_guide/model_management.md): when a reload of a loaded model
    fails for any reason, the loaded model stays unchanged and loaded. Checked for an override that does not
    parse, a load of an unknown model, and an override that parses but does not fit the model file (an input
    the ONNX model lacks)."""
    repository = tmp_path / "repository"
    shutil.copytree(demo_repository / "simple", repository / "simple")
    server = slotserve(repository, parallel_jobs=2, allow_management=True)

    outcomes = run_client(SCRIPT, server.address, "failed_reload")

    assert sorted(outcomes) == ["not_json", "unknown_input", "unknown_model"]
    for label, outcome in outcomes.items():
        assert outcome["error"] is not None, (label, outcome)
        assert outcome["error"]["message"].startswith(TRITONS_LOAD_WORDS[label]), (label, outcome)
    for label, outcome in outcomes.items():
        assert outcome["ready_after"] is True, (label, outcome)
        assert outcome["mbs_after"] == 4, (label, outcome)
        assert outcome["infer_after"] == "ok", (label, outcome)


def test_server_metadata_and_unknown_model(server, run_client):
    result = run_client(SCRIPT, server.address, "metadata")
    assert result["server"]["name"] == "slotserve"
    assert result["server"]["version"]
    assert "model_repository" in result["server"]["extensions"]
    model = result["model"]
    assert model["name"] == "simple" and model["versions"] == ["1"]
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in model["inputs"]] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    for label, error in result["errors"].items():
        assert error is not None, f"{label} on an unknown model succeeded"
        assert error["status"] == "StatusCode.NOT_FOUND", (label, error)
        assert "Request for unknown model" in error["message"], (label, error)
    assert result["unknown_model_ready"] is False


def test_concurrent_requests_to_a_batching_model_are_batched_and_each_answer_matches_numpy(
    slotserve, tmp_path, run_client
):
    """The demo's weight-bound MLP, with a delay and a preferred batch size of 16 so that the 16 concurrent
    requests form one batch whatever the machine's load: one execution of 16 rows, every request answered with
    its own row, recomputed with numpy."""
    from demo.build_repository import mlp_reference
    from tests.integration._support import require_demo

    demo, repository = require_demo() / "mlp", tmp_path / "repo"
    (repository / "mlp").mkdir(parents=True)
    (repository / "mlp" / "1").symlink_to(demo / "1", target_is_directory=True)  # the weights, not copied
    (repository / "mlp" / "config.pbtxt").write_text(
        (demo / "config.pbtxt")
        .read_text()
        .replace(
            "dynamic_batching { }",
            "dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: 16 }",
        )
    )
    server = slotserve(repository, parallel_jobs=2, allowed_model_roots=[demo])  # the link to the weights leaves
    result = run_client(SCRIPT, server.address, "batched", "mlp", "16")
    assert len(result["answers"]) == 16
    answers = list(result["answers"].values())
    rows = np.concatenate([np.asarray(answer["INPUT0"], np.float32) for answer in answers])
    outputs = np.concatenate([np.asarray(answer["OUTPUT0"], np.float32) for answer in answers])
    np.testing.assert_allclose(outputs, mlp_reference(rows), rtol=1e-3, atol=1e-3)
    statistics = result["statistics"]
    assert int(statistics["execution_count"]) == 1 and int(statistics["inference_count"]) == 16
    assert [int(batch["batch_size"]) for batch in statistics["batch_stats"]] == [16]

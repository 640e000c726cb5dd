"""Ensembles that call themselves, on a real server: every cycle through ensembles (an ensemble naming itself, two
naming each other, longer ones, one further down, through a version number) is refused when it loads, naming the
cycle in Triton's words and ours, by every path: startup, RepositoryModelLoad, RegisterModel, poll mode and a load
with files that changes a step. Nothing else is disturbed: the server stays live, other models serve, and an
ensemble that was serving keeps serving its old steps. Also the chain limit (MAX_NESTING), and the guard that
stops a cycle two racing reloads could still make. engine/config/ensemble_graph.py `call_graph_refusal` decides;
tests/unit/engine/config/test_ensemble_graph.py checks it alone and tests/fuzz/test_ensemble_cycles_fuzz.py on
generated graphs; the last test asks `check` (which goes through the same load path) for the same verdicts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb

from .._support import CALL_TIMEOUT, client_error, rpc_error, stub, write_fixture_model
from .test_ensembles import F, ensemble_config, start_fixture_server, write_ensemble

X = np.ones(2, "f")
CYCLE = "circular dependency between ensembles"  # Triton's words (tests/differential/test_ensemble_cycles.py)


def through(*models: str, version: int = -1):
    """The steps of a chain through `models`: X -> models[0] -> ... -> Y (fixture I/O: INPUT0 -> OUTPUT0)."""
    steps = []
    for index, model in enumerate(models):
        source = "X" if index == 0 else f"t{index}"
        target = "Y" if index == len(models) - 1 else f"t{index + 1}"
        steps.append((model, {"INPUT0": source}, {"OUTPUT0": target}))
    return steps


def fan(model: str, width: int):
    """`width` parallel steps on `model`, all reading X; the first writes Y."""
    return [(model, {"INPUT0": "X"}, {"OUTPUT0": "Y" if index == 0 else f"t{index}"}) for index in range(width)]


def ensemble(root: Path, name: str, steps) -> None:
    """An ensemble with the fixture models' tensor names (INPUT0 -> OUTPUT0), so that it can be a step too."""
    write_ensemble(root, name, [("INPUT0", F, [-1])], [("OUTPUT0", F, [-1])], _renamed(steps))


def _renamed(steps):
    names = {"X": "INPUT0", "Y": "OUTPUT0"}
    return [
        (m, {k: names.get(v, v) for k, v in i.items()}, {k: names.get(v, v) for k, v in o.items()}) for m, i, o in steps
    ]


def fixture_model(root: Path, name: str) -> None:
    write_fixture_model(root, name, inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])


def cyclic_repository(root: Path) -> None:
    fixture_model(root, "w")
    ensemble(root, "selfie", through("selfie"))  # one step naming itself: recursed to RecursionError
    ensemble(root, "twice", fan("twice", 2))  # two parallel self-steps: thousands of threads
    ensemble(root, "ping", through("w", "pong"))
    ensemble(root, "pong", through("ping"))
    ensemble(root, "l1", through("l2"))
    ensemble(root, "l2", through("w", "l3"))
    ensemble(root, "l3", through("l1"))
    ensemble(root, "outer", through("w", "ping"))  # reaches a cycle it is not on
    ensemble(root, "fine", through("w", "w"))
    versioned = ensemble_config("pinned", [("INPUT0", F, [-1])], [("OUTPUT0", F, [-1])], through("pinned"))
    (root / "pinned" / "1").mkdir(parents=True)
    (root / "pinned" / "config.pbtxt").write_text(
        versioned.replace("model_version: -1", "model_version: 1")
        .replace('"X"', '"INPUT0"')
        .replace('"Y"', '"OUTPUT0"')
    )


EXPECTED = {
    "selfie": f"{CYCLE}: ensemble 'selfie' calls itself through selfie -> selfie",
    "twice": f"{CYCLE}: ensemble 'twice' calls itself through twice -> twice",
    "pinned": f"{CYCLE}: ensemble 'pinned' calls itself through pinned -> pinned",
    "ping": f"{CYCLE}: ensemble 'ping' calls itself through ping -> pong -> ping",
    "pong": f"{CYCLE}: ensemble 'pong' calls itself through pong -> ping -> pong",
    "l1": f"{CYCLE}: ensemble 'l1' calls itself through l1 -> l2 -> l3 -> l1",
    "l2": f"{CYCLE}: ensemble 'l2' calls itself through l2 -> l3 -> l1 -> l2",
    "l3": f"{CYCLE}: ensemble 'l3' calls itself through l3 -> l1 -> l2 -> l3",
    "outer": f"{CYCLE}: ensemble 'outer' calls ensemble 'ping' (outer -> ping), which calls itself through "
    "ping -> pong -> ping",
}


def index_of(running) -> dict:
    return {m.name: m for m in running.client.repository_index()}


def assert_still_serving(running, before_threads: int) -> None:
    """The server answers at once, its other models serve, and no thread was left behind."""
    started = time.monotonic()
    assert running.client.live(timeout=10)
    np.testing.assert_array_equal(running.client.infer("w", {"INPUT0": X}, timeout=10)["OUTPUT0"], X)
    np.testing.assert_array_equal(running.client.infer("fine", {"INPUT0": X}, timeout=10)["OUTPUT0"], X)
    assert time.monotonic() - started < 10
    assert threading.active_count() <= before_threads + 12, threading.active_count()


@pytest.mark.parametrize("mode", ["default", "lazy"])
def test_every_cycle_is_refused_at_startup_naming_it_and_a_request_to_it_harms_nothing(tmp_path, controls, mode):
    cyclic_repository(tmp_path)
    options = {"load_at_startup": False} if mode == "lazy" else {}
    with start_fixture_server(tmp_path, controls, **options) as running:
        before = threading.active_count()
        for name, reason in EXPECTED.items():
            # a request loads it (lazy mode) or retries its failed load: refused with the reason, never run
            failed = client_error(running.client.infer, name, {"INPUT0": X}, timeout=30)
            assert failed.code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), (name, failed)
            assert reason in failed.message, (name, failed.message)
            assert "RecursionError" not in failed.message and len(failed.message) < 400, failed.message
            index = index_of(running)
            assert index[name].state == "UNAVAILABLE" and reason in index[name].reason, (name, index[name])
            assert not running.client.model_ready(name)
        assert_still_serving(running, before)
        assert index_of(running)["fine"].state == "READY"


def test_repository_model_load_refuses_each_cycle_naming_it(tmp_path, controls):
    cyclic_repository(tmp_path)
    options = {"model_control_mode": "explicit", "allow_management": True, "load_models": ("w", "fine")}
    with start_fixture_server(tmp_path, controls, **options) as running:
        before = threading.active_count()
        for name, reason in EXPECTED.items():
            refused = client_error(running.client.load, name, timeout=CALL_TIMEOUT)
            assert refused.code == "INVALID_ARGUMENT" and reason in refused.message, (name, refused)
            assert index_of(running)[name].state == "UNAVAILABLE"
        assert_still_serving(running, before)


def test_register_model_refuses_an_ensemble_calling_itself(tmp_path, controls):
    fixture_model(tmp_path, "w")
    ensemble(tmp_path, "fine", through("w"))
    elsewhere = tmp_path.parent / f"{tmp_path.name}-sources"
    ensemble(elsewhere, "mirror", through("w", "mirror"))
    options = {"allow_management": True, "allowed_model_roots": (str(elsewhere),)}
    with start_fixture_server(tmp_path, controls, **options) as running:
        before = threading.active_count()
        refused = client_error(running.management.register, "mirror", source=str(elsewhere / "mirror"))
        assert refused.code == "INVALID_ARGUMENT"
        assert f"{CYCLE}: ensemble 'mirror' calls itself through mirror -> mirror" in refused.message
        assert running.management.get("mirror").state != "READY"
        assert_still_serving(running, before)


def test_poll_mode_refuses_a_cycle_it_finds_and_keeps_polling(tmp_path, controls):
    fixture_model(tmp_path, "w")
    ensemble(tmp_path, "fine", through("w"))
    with start_fixture_server(tmp_path, controls, model_control_mode="poll", repository_poll_seconds=3600) as running:
        before = threading.active_count()
        ensemble(tmp_path, "ping", through("pong"))
        ensemble(tmp_path, "pong", through("w", "ping"))
        running.server.control.poll_once()
        index = index_of(running)
        for name, cycle in (("ping", "ping -> pong -> ping"), ("pong", "pong -> ping -> pong")):
            assert index[name].state == "UNAVAILABLE" and f"calls itself through {cycle}" in index[name].reason
        assert_still_serving(running, before)
        ensemble(tmp_path, "later", through("w"))  # the poller goes on
        running.server.control.poll_once()
        np.testing.assert_array_equal(running.client.infer("later", {"INPUT0": X})["OUTPUT0"], X)


def files_load(running, name: str, steps) -> pb.RepositoryModelLoadRequest:
    """RepositoryModelLoad of ensemble `name` with files (its config as JSON, its empty version folder's marker)."""
    text = ensemble_config(name, [("INPUT0", F, [-1])], [("OUTPUT0", F, [-1])], _renamed(steps))
    from google.protobuf import json_format, text_format

    from generated import model_config_pb2

    config = json_format.MessageToJson(text_format.Parse(text, model_config_pb2.ModelConfig()))
    request = pb.RepositoryModelLoadRequest(model_name=name)
    request.parameters["config"].string_param = config
    request.parameters["file:1/README"].bytes_param = b"an ensemble has no model file\n"
    return request


@pytest.fixture
def explicit(tmp_path, controls):
    root = tmp_path / "models"
    for name in ("w", "w2"):
        fixture_model(root, name)
    ensemble(root, "a", through("w"))
    files_dir = tmp_path / "files"
    files_dir.mkdir()
    options = {
        "model_control_mode": "explicit",
        "allow_management": True,
        "load_models": ("*",),
        "model_files_dir": files_dir,
    }
    with start_fixture_server(root, controls, **options) as running:
        yield running


def served_by(running, model: str) -> int:
    return {s.name: s for s in running.client.statistics()}[model].inference_stats.success.count


def test_a_load_with_files_that_changes_a_step_serves_the_new_step(explicit):
    running = explicit
    np.testing.assert_array_equal(running.client.infer("a", {"INPUT0": X})["OUTPUT0"], X)
    assert served_by(running, "w") == 1
    stub(running).RepositoryModelLoad(files_load(running, "a", through("w2")), timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(running.client.infer("a", {"INPUT0": X})["OUTPUT0"], X)
    # the new step ran, not the old one (the same tensors: a reload once kept the old steps as "the same engine")
    assert (served_by(running, "w"), served_by(running, "w2")) == (1, 1)


def test_a_load_with_files_that_makes_a_step_call_its_ensemble_is_refused_and_the_old_steps_serve(explicit):
    running = explicit
    before = threading.active_count()
    refused = rpc_error(stub(running).RepositoryModelLoad, files_load(running, "a", through("w", "a")))
    assert refused.code == "INVALID_ARGUMENT"
    assert f"{CYCLE}: ensemble 'a' calls itself through a -> a" in refused.message
    np.testing.assert_array_equal(running.client.infer("a", {"INPUT0": X}, timeout=10)["OUTPUT0"], X)
    assert served_by(running, "w") == 1  # the old steps serve
    # a mutual cycle through a step model turned into an ensemble: refused too, naming it from the new one
    refused = rpc_error(stub(running).RepositoryModelLoad, files_load(running, "w", through("a")))
    assert refused.code == "INVALID_ARGUMENT"
    assert f"{CYCLE}: ensemble 'w' calls itself through w -> a -> w" in refused.message
    np.testing.assert_array_equal(running.client.infer("a", {"INPUT0": X}, timeout=10)["OUTPUT0"], X)
    assert running.client.live(timeout=10) and threading.active_count() <= before + 12


def nested(root: Path, depth: int) -> None:
    """e1 -> e2 -> ... -> e<depth> -> w: `depth` ensembles in a chain."""
    fixture_model(root, "w")
    for level in range(1, depth + 1):
        ensemble(root, f"e{level}", through(f"e{level + 1}" if level < depth else "w"))


def test_a_chain_of_ensembles_runs_up_to_the_limit_and_a_longer_one_is_refused_naming_it(tmp_path, controls):
    from engine.config.ensemble_graph import MAX_NESTING

    nested(tmp_path / "ok", MAX_NESTING)
    with start_fixture_server(tmp_path / "ok", controls) as running:
        np.testing.assert_array_equal(running.client.infer("e1", {"INPUT0": X})["OUTPUT0"], X)
        assert served_by(running, "w") == 1
    nested(tmp_path / "deep", MAX_NESTING + 1)
    with start_fixture_server(tmp_path / "deep", controls) as running:
        failed = client_error(running.client.infer, "e1", {"INPUT0": X}, timeout=30)
        assert f"ensemble 'e1' nests {MAX_NESTING + 1} ensembles deep (e1 -> e2 -> " in failed.message, failed
        np.testing.assert_array_equal(running.client.infer("e2", {"INPUT0": X})["OUTPUT0"], X)


def test_a_cycle_that_got_past_the_load_check_is_stopped_at_its_first_turn(tmp_path, controls, monkeypatch):
    # Two reloads racing each other could each be checked against the other's old steps. Stand in for that race
    # by switching the load check off: the running ensemble still refuses to call itself, with no thread storm
    # and no RecursionError.
    import service.ensemble

    monkeypatch.setattr(service.ensemble, "call_graph_refusal", lambda name, steps_of: None)
    fixture_model(tmp_path, "w")
    ensemble(tmp_path, "fine", through("w"))
    ensemble(tmp_path, "twice", fan("twice", 2))
    ensemble(tmp_path, "ping", through("w", "pong"))
    ensemble(tmp_path, "pong", through("ping"))
    with start_fixture_server(tmp_path, controls, load_at_startup=False) as running:  # each loads when called
        before = threading.active_count()
        for name, cycle in (("twice", "twice -> twice"), ("ping", "ping -> pong -> ping")):
            failed = client_error(running.client.infer, name, {"INPUT0": X}, timeout=30)
            assert failed.code == "INVALID_ARGUMENT", failed
            assert f"{CYCLE}: ensemble '{name}' calls itself through {cycle}" in failed.message, failed
            assert "RecursionError" not in failed.message and len(failed.message) < 400, failed.message
        assert_still_serving(running, before)


def test_check_refuses_the_same_cycles_in_the_same_words(tmp_path, capsys):
    # `python -m service check` reaches its verdicts through the server's own load path (EnsembleBackend.load,
    # so call_graph_refusal): the same decision and the same words as the server's index above.
    import json

    from service.check import main

    cyclic_repository(tmp_path)
    assert main([str(tmp_path), "--enable-test-backends", "--format", "json"]) == 1
    verdicts = {model["name"]: model for model in json.loads(capsys.readouterr().out)["models"]}
    for name, reason in EXPECTED.items():
        assert not verdicts[name]["serves"] and verdicts[name]["reason"] == reason, verdicts[name]
    assert verdicts["fine"]["serves"] and verdicts["w"]["serves"]


def test_repository_model_load_of_a_chain_far_past_the_limit_is_refused_by_name_not_by_recursion(tmp_path, controls):
    # RepositoryModelLoad loads an ensemble's steps first, each inner ensemble's steps before it: a chain of 1,200
    # used to recurse past Python's limit there (INTERNAL RecursionError) before the nesting check could speak.
    from engine.config.ensemble_graph import MAX_NESTING

    nested(tmp_path, 1200)
    options = {"model_control_mode": "explicit", "allow_management": True, "load_models": ("w",)}
    with start_fixture_server(tmp_path, controls, **options) as running:
        before = threading.active_count()
        refused = client_error(running.client.load, "e1", timeout=120)
        assert refused.code == "INVALID_ARGUMENT", refused
        assert "ensemble 'e1' nests" in refused.message and "RecursionError" not in refused.message, refused
        assert len(refused.message) < 1000, refused.message
        # only the levels the nesting check can name were tried: the chain's far end was never read nor loaded
        index = index_of(running)
        tried = [name for name, entry in index.items() if entry.state == "READY" or entry.reason != "unloaded"]
        assert "e1200" not in tried and len(tried) <= MAX_NESTING + 2, tried
        assert running.client.live(timeout=10)
        np.testing.assert_array_equal(running.client.infer("w", {"INPUT0": X}, timeout=10)["OUTPUT0"], X)
        assert threading.active_count() <= before + 12, threading.active_count()

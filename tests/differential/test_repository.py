"""Triton's model-repository extension asked of both servers: RepositoryModelUnload, then what RepositoryIndex,
ModelReady and ModelInfer say. Triton allows repository control only with --model-control-mode=explicit, so the
reference runs in that mode with every model loaded at startup (--load-model=*); slotserve runs in its default
mode with management allowed."""

from __future__ import annotations

import time

import pytest

from generated import grpc_service_pb2 as pb

from .calls import add_sub_request, outcome, outputs_by_name

UNLOAD_SECONDS = 60.0  # the python backend's stub process stops in about a second; a loaded machine gets margin


@pytest.fixture
def pair(triton, slotserve_endpoint, write_repositories):
    repositories = write_repositories()
    reference = triton(repositories.triton, "--model-control-mode=explicit", "--load-model=*")
    return reference, slotserve_endpoint(repositories.slotserve)


def _index(endpoint) -> list[tuple[str, str, str, str]]:
    code, reply = outcome(endpoint.stub.RepositoryIndex, pb.RepositoryIndexRequest())
    assert code == "OK", (endpoint.name, reply)
    return sorted((m.name, m.version, m.state, m.reason) for m in reply.models)


def _unload(endpoint, model: str = "simple") -> None:
    """RepositoryModelUnload, then wait (deadline UNLOAD_SECONDS) until the index no longer says UNLOADING:
    Triton answers the call before the model's teardown ends (the index says UNLOADING meanwhile); slotserve
    answers once the model is retired."""
    code, reply = outcome(endpoint.stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=model))
    assert code == "OK", (endpoint.name, reply)
    deadline = time.monotonic() + UNLOAD_SECONDS
    while any(entry[0] == model and entry[2] == "UNLOADING" for entry in _index(endpoint)):
        assert time.monotonic() < deadline, f"{endpoint.name}: {model} still UNLOADING after {UNLOAD_SECONDS}s"
        time.sleep(0.1)  # ordering-free: polls an observable state until a deadline


@pytest.fixture
def unloaded(pair):
    """The pair after RepositoryModelUnload("simple") answered OK on both and its teardown ended."""
    for endpoint in pair:
        _unload(endpoint)
    return pair


def test_slotserve_unload_answers_after_the_model_is_retired(pair):
    """slotserve's unload answers after the model is retired (docs/lifecycle.md: "from that moment it shows as
    not loaded"), so its index never says UNLOADING right after the call; Triton's may."""
    ours = pair[1]
    code, reply = outcome(ours.stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="simple"))
    assert code == "OK", reply
    assert _index(ours)[0] == ("simple", "1", "UNAVAILABLE", "unloaded")


def test_index_before_unload(pair):
    triton, ours = (_index(endpoint) for endpoint in pair)
    assert ours == triton == [("simple", "1", "READY", ""), ("simple_int8", "1", "READY", "")]


def test_index_after_unload_names_state_and_reason(unloaded):
    triton, ours = (_index(endpoint) for endpoint in unloaded)
    assert triton == [("simple", "1", "UNAVAILABLE", "unloaded"), ("simple_int8", "1", "READY", "")]
    assert ours == triton


def test_model_ready_after_unload(unloaded):
    for model, version, expected in [("simple", "", False), ("simple", "1", False), ("simple_int8", "", True)]:
        answers = [outcome(e.stub.ModelReady, pb.ModelReadyRequest(name=model, version=version)) for e in unloaded]
        assert [(code, reply.ready) for code, reply in answers] == [("OK", expected)] * 2, (model, version)


def test_infer_after_unload_triton_refuses_slotserve_loads_again(unloaded):
    """Triton in explicit mode refuses an unloaded model (NOT_FOUND, "... has no available versions", not
    UNAVAILABLE); slotserve's default mode loads it for the request (docs/behaviour.md, OPS.unloaded.infer), so
    this asserts each server's own documented answer."""
    (triton, triton_reply), (code, reply) = (outcome(e.stub.ModelInfer, add_sub_request("simple")) for e in unloaded)
    assert (triton, triton_reply) == ("NOT_FOUND", "Request for unknown model: 'simple' has no available versions")
    assert code == "OK", reply
    assert _index(unloaded[1])[0] == ("simple", "1", "READY", "")


def test_other_model_unaffected_by_unload(unloaded):
    answers = [
        outcome(e.stub.ModelInfer, add_sub_request("simple_int8", dtype="int8", datatype="INT8")) for e in unloaded
    ]
    assert [code for code, _ in answers] == ["OK", "OK"], answers
    assert outputs_by_name(answers[0][1]) == outputs_by_name(answers[1][1])


def test_unload_twice_is_ok_on_both(unloaded):
    for endpoint in unloaded:
        _unload(endpoint)
    triton, ours = (_index(endpoint) for endpoint in unloaded)
    assert ours == triton


def test_unload_of_unknown_model(pair):
    """Both answer OK: a model the repository does not have is unloaded already (as a second unload finds it)."""
    answers = [
        outcome(e.stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="nowhere")) for e in pair
    ]
    assert [code for code, _ in answers] == ["OK", "OK"], answers
    assert [_index(endpoint) for endpoint in pair] == [
        [("simple", "1", "READY", ""), ("simple_int8", "1", "READY", "")]
    ] * 2


@pytest.fixture
def explicit_pair(triton, slotserve_endpoint, write_repositories):
    """Both servers in explicit mode with only `simple` loaded at startup."""
    repositories = write_repositories()
    options = ("--model-control-mode=explicit", "--load-model=simple")
    reference = triton(repositories.triton, *options)
    return reference, slotserve_endpoint(repositories.slotserve, model_control_mode="explicit", load_models=("simple",))


def test_load_of_unknown_model_gets_tritons_code_and_words(explicit_pair):
    """Triton answers INTERNAL "failed to load 'x', failed to poll from model repository", which its clients and
    QA tests read; slotserve answers the same, then says where it looked (issue 34, item 8; docs/errors.md)."""
    request = pb.RepositoryModelLoadRequest(model_name="nowhere")
    (triton, triton_reply), (code, reply) = (outcome(e.stub.RepositoryModelLoad, request) for e in explicit_pair)
    assert (triton, triton_reply) == ("INTERNAL", "failed to load 'nowhere', failed to poll from model repository")
    assert (code, reply) == (
        "INTERNAL",
        "failed to load 'nowhere', failed to poll from model repository: no model folder 'nowhere' in the repository",
    )


def test_index_of_a_model_never_loaded_in_explicit_mode(explicit_pair):
    """Triton lists a model it never loaded with no version, state or reason; slotserve registers every
    repository model at startup and says UNAVAILABLE "unloaded" with its version (docs/model-control.md)."""
    triton, ours = (_index(endpoint) for endpoint in explicit_pair)
    assert triton == [("simple", "1", "READY", ""), ("simple_int8", "", "", "")]
    assert ours == [("simple", "1", "READY", ""), ("simple_int8", "1", "UNAVAILABLE", "unloaded")]


TRITON_ON_UNLOADED = {
    "ModelMetadata": ("NOT_FOUND", "Request for unknown model: 'simple' has no available versions"),
    "ModelConfig": ("NOT_FOUND", "Request for unknown model: 'simple' has no available versions"),
    "ModelStatistics": ("INVALID_ARGUMENT", "requested model 'simple' is not available"),
}


@pytest.mark.parametrize("method", list(TRITON_ON_UNLOADED))
def test_status_calls_on_the_unloaded_model(unloaded, method):
    """Triton refuses metadata, config and statistics of an unloaded model; slotserve answers them in every
    state (docs/lifecycle.md, "What each call reports in each state": metadata from the last loaded engine or
    the configuration, config and statistics always), so this asserts each server's own answer."""
    request = getattr(pb, f"{method}Request")(name="simple")
    (triton, triton_reply), (code, reply) = (outcome(getattr(e.stub, method), request) for e in unloaded)
    assert (triton, triton_reply) == TRITON_ON_UNLOADED[method]
    assert code == "OK", reply

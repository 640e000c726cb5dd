"""Model versions asked of both servers: the add/sub model with version folders 1, 2 and 3 under each policy, then
what RepositoryIndex, ModelReady, ModelMetadata, ModelStatistics and ModelInfer answer per version and with none
named."""

from __future__ import annotations

import shutil

import pytest

from generated import grpc_service_pb2 as pb

from .calls import add_sub_request, outcome

POLICIES = {
    "default": "",
    "latest 2": "version_policy { latest { num_versions: 2 } }\n",
    "all": "version_policy { all { } }\n",
    "specific 1, 3": "version_policy { specific { versions: [ 1, 3 ] } }\n",
}


def _with_versions(repository, policy: str) -> None:
    """`simple` of `repository` with version folders 1, 2 and 3 (copies of 1) and `policy` in its config."""
    folder = repository / "simple"
    for version in ("2", "3"):
        shutil.copytree(folder / "1", folder / version)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + policy)


@pytest.fixture(params=sorted(POLICIES))
def pair(request, triton, slotserve_endpoint, write_repositories):
    repositories = write_repositories(("simple",))
    for repository in (repositories.triton, repositories.slotserve):
        _with_versions(repository, POLICIES[request.param])
    return triton(repositories.triton), slotserve_endpoint(repositories.slotserve)


def _index(endpoint) -> list[tuple[str, str, str]]:
    code, reply = outcome(endpoint.stub.RepositoryIndex, pb.RepositoryIndexRequest())
    assert code == "OK", (endpoint.name, reply)
    return sorted((m.name, m.version, m.state) for m in reply.models)


def test_the_index_lists_the_served_versions(pair):
    triton, ours = pair
    assert _index(ours) == _index(triton)


def test_ready_per_version_and_with_none_named(pair):
    for version in ("", "1", "2", "3", "4"):
        answers = [outcome(e.stub.ModelReady, pb.ModelReadyRequest(name="simple", version=version)) for e in pair]
        assert [a[0] for a in answers] == ["OK", "OK"], answers
        assert answers[0][1].ready == answers[1][1].ready, (version, answers)


def test_metadata_lists_the_versions_as_triton(pair):
    for version in ("", "1", "3"):
        answers = [outcome(e.stub.ModelMetadata, pb.ModelMetadataRequest(name="simple", version=version)) for e in pair]
        if answers[0][0] != "OK":
            assert answers[1][0] == answers[0][0], (version, answers)
            continue
        assert answers[1][0] == "OK", (version, answers)
        assert list(answers[1][1].versions) == list(answers[0][1].versions), version


def test_inference_answers_from_the_version_asked_or_the_highest(pair):
    for version in ("", "1", "2", "3"):
        answers = [outcome(e.stub.ModelInfer, add_sub_request(version=version)) for e in pair]
        assert answers[1][0] == answers[0][0], (version, answers)
        if answers[0][0] == "OK":
            assert answers[1][1].model_version == answers[0][1].model_version, version


def test_statistics_per_version_and_for_every_version(pair):
    """For each version Triton serves, and none named. (A version not served: Triton answers INVALID_ARGUMENT,
    slotserve NOT_FOUND, the difference test_statistics.py's UNKNOWN_STATISTICS states.)"""
    triton = pair[0]
    served = [
        v for v in ("1", "2", "3") if triton.stub.ModelReady(pb.ModelReadyRequest(name="simple", version=v)).ready
    ]
    assert served
    for version in ["", *served]:
        request = pb.ModelStatisticsRequest(name="simple", version=version)
        answers = [outcome(e.stub.ModelStatistics, request) for e in pair]
        assert answers[1][0] == answers[0][0], (version, answers)
        if answers[0][0] == "OK":
            rows = [sorted((s.name, s.version) for s in reply.model_stats) for _code, reply in answers]
            assert rows[1] == rows[0], version

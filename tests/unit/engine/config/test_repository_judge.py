"""ModelRepository.judge (what `python -m service check` reads) is the server's `read`, as a record: the same spec
when the model reads, the same error text when it does not, and the refused and ignored fields the error and the
warning name."""

from __future__ import annotations

import logging

import pytest

from engine.config.repository import ModelRepository
from engine.errors import ModelConfigError

TENSORS = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)
CONFIGS = {
    "good": f'backend: "fixture"\nmax_batch_size: 4\n{TENSORS}dynamic_batching {{ }}\n',
    "ignored": f'backend: "fixture"\n{TENSORS}dynamic_batching {{ }}\n'
    "instance_group [ { count: 1 kind: KIND_GPU } ]\noptimization { priority: PRIORITY_MAX }\n",
    "refused": f'backend: "fixture"\n{TENSORS}'
    'batch_output [ { target_name: "Y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "X" } ]\n'
    "instance_group [ { passive: true } ]\n"
    "optimization { priority: PRIORITY_MAX }\n",
    "unparsable": 'backend: "fixture"\ninput [ { name: "X" ',
    "no_versions": f'backend: "fixture"\n{TENSORS}version_policy {{ latest {{ num_versions: 0 }} }}\n',
    "other_version": f'backend: "fixture"\n{TENSORS}version_policy {{ specific {{ versions: 1 }} }}\n',
    "python": 'backend: "python"\n',
    "bad_warmup": f'backend: "fixture"\n{TENSORS}model_warmup [ {{ name: "w" batch_size: 1 inputs [ {{ key: "Z" '
    "value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } ] } ]\n",
}
VERSIONS = {"other_version": ("1", "2")}


@pytest.fixture
def repository(tmp_path):
    for name, config in CONFIGS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(config)
        for version in VERSIONS.get(name, ("1",)):
            (tmp_path / name / version).mkdir()
    return ModelRepository(tmp_path)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_judge_gives_what_read_gives(repository, name):
    reading = repository.judge(name)
    try:
        spec = repository.read(name)
    except ModelConfigError as error:
        assert reading.spec is None and str(reading.error) == str(error)
    else:
        assert reading.error is None and reading.spec == spec


def test_the_refused_fields_are_those_the_error_names(repository):
    reading = repository.judge("refused")
    assert {path for path, _ in reading.refused} == {
        "batch_output",
        "instance_group[0].passive",
    }
    for path, reason in reading.refused:
        assert f"{path}: {reason}" in str(reading.error)
    assert [path for path, _ in reading.ignored] == ["optimization"]  # named even though the model is refused


def test_the_ignored_fields_are_those_the_servers_warning_names(repository, caplog):
    with caplog.at_level(logging.WARNING, logger="engine.config.repository"):
        repository.read("ignored")
    (warning,) = [r.getMessage() for r in caplog.records if "settings ignored" in r.getMessage()]
    reading = repository.judge("ignored")
    assert reading.error is None and reading.ignored
    expected = "; ".join(f"{path} ignored: {reason}" for path, reason in reading.ignored)
    assert warning == f"model 'ignored': settings ignored: {expected}"
    assert {path for path, _ in reading.ignored} == {"instance_group[0].kind", "optimization", "dynamic_batching"}


def test_versions_chosen_by_the_policy_are_recorded(repository):
    reading = repository.judge("other_version")
    assert reading.version_folders == (1, 2) and reading.chosen_versions == (1,)
    assert reading.refused == () and reading.error is None  # several versions are served: each its own pool
    assert reading.spec is not None and reading.spec.version == "1"

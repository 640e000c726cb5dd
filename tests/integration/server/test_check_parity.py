"""`python -m service check` and a live server agree, model by model, on every repository the test suite builds
(issue 35): the check's verdict (serves or not, and the reason) is the server's RepositoryIndex state and reason,
and ModelReady, for the same repository under the same flags.

The repositories are the suite's own builders, each written fresh: Triton's example repository, the broken and
cyclic ensembles, the models the backends refuse for their parameters (tests/check_repositories.py), the demo
repository, the python ensemble (tests/ensemble_models.py, good and with a step whose initialize raises), the
sequence models (tests/sequence_models.py, tests/sequence_builders.py), the python models (tests/python_models),
the differential repositories (both sides) and the migration walkthrough's repository (tests/docs/migration.py). A
python model's code runs only with `--load`, so a repository whose model.py fails at load is checked with
`--load`; every other one without it.

The check runs in this process (service.check.main, its JSON on stdout); the server is service.testing.serve (gRPC
on a free port), started as `python -m service` starts by default (test backends off unless the case needs them).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo import build_repository as demo
from service.check import main as check_main
from service.testing import serve
from tests import check_repositories, ensemble_models, sequence_builders, sequence_models
from tests.differential.repositories import write_add_sub_repositories
from tests.docs import migration
from tests.python_models import REPOSITORY as PYTHON_MODELS

from .._support import require_demo


@dataclass(frozen=True)
class Case:
    """A repository builder (it writes into the folder it is given and returns the repository) and the check's
    flags beyond --format json (the server is started with the same ones: server_options)."""

    build: Callable[[Path], Path]
    flags: tuple[str, ...] = ()


def _sequences(root: Path) -> Path:
    oldest = sequence_models.SequenceOptions(strategy=sequence_models.OLDEST, max_queue_delay_microseconds=100)
    sequence_models.write_python_echo(root)
    sequence_models.write_python_accumulate(root, options=oldest)
    sequence_models.write_python_stateful(root)
    sequence_models.write_onnx_echo(root)
    sequence_models.write_onnx_accumulate(root, options=oldest)
    sequence_models.write_onnx_echo(root, "onnx_echo_unbatched", sequence_models.SequenceOptions(max_batch_size=0))
    sequence_builders.write_accumulate(root)
    sequence_builders.write_accumulate(root, "accumulate_batched", batched=True, max_batch_size=4)
    sequence_builders.write_controls(root)
    sequence_builders.write_fixture_sequence(root)
    return root


def _demo(root: Path) -> Path:
    """The demo repository `make models` built (silero's models are a download)."""
    return require_demo()


def _python_models(root: Path) -> Path:
    return PYTHON_MODELS


def _differential_slotserve(root: Path) -> Path:
    return write_add_sub_repositories(root).slotserve


def _differential_triton(root: Path) -> Path:
    return write_add_sub_repositories(root).triton


def _walkthrough(root: Path) -> Path:
    return migration.write_before(root)


def _walkthrough_after(root: Path) -> Path:
    migration.write_before(root)
    migration.first_edit(root)
    migration.second_edit(root)
    return root / migration.REPOSITORY


def _demo_models_built_here(root: Path) -> Path:
    """The demo's models that need no download, as build_repository writes them."""
    for build in (demo.build_simple, demo.build_simple_string, demo.build_simple_identity, demo.build_mlp):
        demo.write_model(root, build())
    demo.write_python_model(root, "byte_tokenizer", demo.BYTE_TOKENIZER_CONFIG, demo.BYTE_TOKENIZER_SOURCE)
    return root


CASES = {
    "triton_examples": Case(check_repositories.write_triton_examples),
    "triton_examples_parallel": Case(check_repositories.write_triton_examples, ("--parallel-jobs", "2")),
    "broken_ensembles": Case(check_repositories.write_broken_ensembles),
    "ensemble_cycle": Case(check_repositories.write_ensemble_cycle),
    "hostile_files": Case(check_repositories.write_hostile_files),
    "backend_refusals": Case(check_repositories.write_backend_refusals),
    "backend_refusals_parallel": Case(check_repositories.write_backend_refusals, ("--parallel-jobs", "2")),
    "demo": Case(_demo),
    "demo_built_here": Case(_demo_models_built_here, ("--parallel-jobs", "2")),
    "python_ensemble": Case(ensemble_models.write_python_pipeline),
    "python_ensemble_broken_step": Case(
        lambda root: ensemble_models.write_python_pipeline(root, broken_square=True), ("--load",)
    ),
    "sequences": Case(_sequences, ("--enable-test-backends",)),
    "sequences_parallel": Case(_sequences, ("--enable-test-backends", "--parallel-jobs", "2")),
    "python_models": Case(_python_models, ("--parallel-jobs", "2")),
    "differential_slotserve": Case(_differential_slotserve),
    "differential_triton": Case(_differential_triton),
    "walkthrough": Case(_walkthrough),
    "walkthrough_after": Case(_walkthrough_after, ("--parallel-jobs", "2")),
}


def server_options(flags: tuple[str, ...]) -> dict:
    """serve's keywords for the check's flags (those the cases use)."""
    options: dict = {"enable_test_backends": "--enable-test-backends" in flags}
    if "--parallel-jobs" in flags:
        options["parallel_jobs"] = int(flags[flags.index("--parallel-jobs") + 1])
    return options


def index_verdicts(repository: Path, options: dict) -> dict[str, tuple[bool, str]]:
    """name -> (serves, reason) from a live server's RepositoryIndex and ModelReady: serves when every version is
    READY and ready; the reason is the first version's that is not, without RepositoryIndex's "failed to load: "
    opening or the model's own name."""
    with serve(repository, **options) as running:
        rows: dict[str, list] = {}
        for row in running.client.repository_index():
            rows.setdefault(row.name, []).append(row)
        verdicts = {}
        for name, versions in rows.items():
            serves, reason = True, ""
            for row in sorted(versions, key=lambda r: int(r.version or 0)):
                ready = row.state == "READY" and running.client.model_ready(name, row.version)
                if not ready and serves:
                    serves = False
                    reason = row.reason.removeprefix("failed to load: ").removeprefix(f"model '{name}': ")
            verdicts[name] = (serves, reason)
        return verdicts


def check_verdicts(repository: Path, flags: tuple[str, ...], capsys) -> tuple[int, dict[str, tuple[bool, str]]]:
    capsys.readouterr()
    status = check_main([str(repository), "--format", "json", *flags])
    report = json.loads(capsys.readouterr().out)
    return status, {m["name"]: (m["serves"], m["reason"] or "") for m in report["models"]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_check_gives_the_servers_verdict_on_every_repository_the_suite_builds(case, tmp_path, capsys):
    built = CASES[case]
    repository = built.build(tmp_path)
    status, verdicts = check_verdicts(repository, built.flags, capsys)
    expected = index_verdicts(repository, server_options(built.flags))
    assert verdicts == expected
    assert status == (0 if all(serves for serves, _ in expected.values()) else 1)


# ---- a refusal added to the server's load is the check's too ------------------------------------------------------
# Other changes to what the server refuses (a cycle through ensembles, an unreadable config.pbtxt) reach the check
# through the functions it shares with the server. Each test adds a refusal to one of them, in this process, and
# finds it in the check's verdict in the server's words, and in a live server's.


def _refuse(name: str, original: Callable, error: type[Exception]):
    def refusing(self, *args, **kwargs):
        model = getattr(args[0], "name", args[0]) if args else kwargs.get("name")
        if model == name:
            raise error(f"model '{name}': refused by the new rule")
        return original(self, *args, **kwargs)

    return refusing


def _agree_on(repository: Path, refused: str, serving: set[str], capsys) -> None:
    """The check and a live server agree; `refused` is refused by the new rule; `serving` are the models that serve
    (the steps the rule leaves alone, and the ensembles over them)."""
    _, verdicts = check_verdicts(repository, (), capsys)
    assert verdicts == index_verdicts(repository, server_options(()))
    assert verdicts[refused] == (False, "refused by the new rule")
    assert {name for name, (serves, _) in verdicts.items() if serves} == serving


def test_a_refusal_added_to_the_ensemble_load_reaches_the_check(tmp_path, monkeypatch, capsys):
    from engine.errors import ModelConfigError
    from service.ensemble import EnsembleBackend

    root = check_repositories.write_broken_ensembles(tmp_path)
    shutil.rmtree(root / "missing_step")
    monkeypatch.setattr(EnsembleBackend, "load", _refuse("pipeline", EnsembleBackend.load, ModelConfigError))
    _agree_on(root, "pipeline", {"prep", "scale"}, capsys)


def test_a_refusal_added_to_the_repository_read_reaches_the_check(tmp_path, monkeypatch, capsys):
    from engine.config.repository import ModelRepository
    from engine.errors import ModelConfigError

    root = check_repositories.write_broken_ensembles(tmp_path)
    shutil.rmtree(root / "missing_step")
    original = ModelRepository.read_versions
    monkeypatch.setattr(ModelRepository, "read_versions", _refuse("scale", original, ModelConfigError))
    _agree_on(root, "scale", {"prep"}, capsys)


def test_a_refusal_added_to_the_registry_reaches_the_check(tmp_path, monkeypatch, capsys):
    from service.core.errors import UnsupportedSlotCount
    from service.core.registry import ModelRegistry

    root = check_repositories.write_broken_ensembles(tmp_path)
    shutil.rmtree(root / "missing_step")
    original = ModelRegistry.settings_for
    monkeypatch.setattr(ModelRegistry, "settings_for", _refuse("prep", original, UnsupportedSlotCount))
    _agree_on(root, "prep", {"scale"}, capsys)

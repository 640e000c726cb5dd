"""The Makefile never writes into or deletes a model repository it did not create (issue 19, item 10).

`make run REPOSITORY=/path/to/models` (what the README tells users to run) used to build the demo models into
that folder, replacing a user's own `simple/config.pbtxt` and `1/model.onnx`, and `make clean REPOSITORY=...`
deleted it. Read from `make -n -B` (every command each target would run, as if nothing were up to date; none
is run): with REPOSITORY set to a folder of the user's, the only command that names it is the server's; the
demo is built only into demo/model_repository, and clean removes only that.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from tests.docs.markdown import ROOT

DEMO = "demo/model_repository"


def dry_run(*arguments: str) -> list[str]:
    """The command lines `make -n -B ARGUMENTS` prints (make's own notices left out)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", *arguments],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.strip() and not line.startswith("make")]


@pytest.fixture
def users_repository(tmp_path):
    """A user's repository: a path make would write or delete if it touched it (it is not touched: dry runs)."""
    return str(tmp_path / "my_models")


@pytest.mark.parametrize("target", ["run", "models", "test", "contract", "clean"])
def test_no_command_but_the_server_names_a_users_repository(target, users_repository):
    lines = dry_run(target, f"REPOSITORY={users_repository}")
    naming = [line for line in lines if users_repository in line]
    if target == "run":
        assert len(naming) == 1 and " -m service " in naming[0], naming
        words = shlex.split(naming[0])
        assert words[words.index("--model-repository") + 1] == users_repository, naming
    else:
        assert naming == [], naming


def test_run_with_a_users_repository_does_not_build_the_demo(users_repository):
    """`make run REPOSITORY=x` serves x as it is: no demo build at all (it would only cost time)."""
    lines = dry_run("run", f"REPOSITORY={users_repository}")
    assert not [line for line in lines if "demo.build_repository" in line], lines


def test_run_without_a_repository_builds_the_demo_into_its_own_folder_and_serves_it():
    lines = dry_run("run")
    builds = [shlex.split(line) for line in lines if "demo.build_repository" in line]
    assert builds and all(words[words.index("--output") + 1] == DEMO for words in builds), builds
    serve = [shlex.split(line) for line in lines if " -m service " in line]
    assert len(serve) == 1 and serve[0][serve[0].index("--model-repository") + 1] == DEMO, serve


def test_clean_removes_the_demo_repository_and_nothing_given_on_the_command_line(users_repository):
    removals = [
        shlex.split(line) for line in dry_run("clean", f"REPOSITORY={users_repository}") if line.startswith("rm ")
    ]
    assert removals and any(DEMO in words for words in removals), removals
    assert not any(users_repository in words for words in removals), removals


def test_make_test_says_why_tests_were_skipped():
    """The newcomer's `make test` prints the reason of every skip (pytest -rs), e.g. a missing npm."""
    pytest_lines = [shlex.split(line) for line in dry_run("test") if " -m pytest" in line]
    assert pytest_lines and all("-rs" in words for words in pytest_lines), pytest_lines


def test_run_installs_only_what_serving_needs():
    """`make run` installs requirements.txt and the project; the test, lint and TensorRT API packages
    (requirements-dev.txt, tensorrt-stubs, the CUDA 12 API folder) come only with `make test` / `make lint`."""
    installs = [line for line in dry_run("run") if "pip install" in line]
    assert any("-r requirements.txt" in line for line in installs), installs
    assert not [line for line in installs if "requirements-dev.txt" in line or "tensorrt" in line], installs


def test_make_test_runs_the_lint_gate_before_the_tests():
    lines = dry_run("test")
    gate = [
        i for i, line in enumerate(lines) if "ruff check" in line or "ruff format --check" in line or "mypy" in line
    ]
    tests = [i for i, line in enumerate(lines) if " -m pytest" in line]
    assert len(gate) == 3 and tests and max(gate) < min(tests), lines

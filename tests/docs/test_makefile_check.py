"""`make check REPOSITORY=PATH` runs `python -m service check PATH` on the user's folder as it is (no demo build into
it, nothing written there); without REPOSITORY it checks the demo repository, built first."""

from __future__ import annotations

import shlex

from tests.docs.test_makefile_repositories import DEMO, dry_run


def test_make_check_checks_a_users_repository_as_it_is(tmp_path):
    users = str(tmp_path / "my_models")
    lines = dry_run("check", f"REPOSITORY={users}", "ARGS=--format json")
    naming = [shlex.split(line) for line in lines if users in line]
    assert naming == [[".venv/bin/python", "-m", "service", "check", users, "--format", "json"]], naming
    assert not [line for line in lines if "demo.build_repository" in line], lines


def test_make_check_without_a_repository_checks_the_built_demo():
    lines = dry_run("check")
    assert any("demo.build_repository" in line for line in lines), lines
    checks = [shlex.split(line) for line in lines if " -m service check " in line]
    assert checks == [[".venv/bin/python", "-m", "service", "check", DEMO]], checks

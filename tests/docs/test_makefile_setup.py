"""What the Makefile installs, and that it says so (issue 35, item 5), read from `make -n -B` (every command each
target would run, as if nothing were up to date; none is run):

* `make check` needs only what serving needs: it never installs requirements-dev.txt (the test and lint tools);
* every `pip install` of `make run` (and of `make test`) is announced by a line saying what it installs: on a fresh
  machine they are silent for minutes otherwise (pip runs with --quiet).
"""

from __future__ import annotations

import pytest

from tests.docs.test_makefile_repositories import dry_run


def test_make_check_installs_the_runtime_only():
    commands = dry_run("check")
    assert any("-r requirements.txt" in line for line in commands), commands
    assert not any("requirements-dev.txt" in line or "tensorrt-stubs" in line for line in commands), commands
    assert commands[-1].startswith(".venv/bin/python -m service check ")


@pytest.mark.parametrize("target", ["run", "test"])
def test_every_pip_install_is_announced(target):
    commands = dry_run(target)
    installs = [index for index, line in enumerate(commands) if "pip install" in line]
    assert installs, commands
    for index in installs:
        announced = commands[index - 1]
        assert announced.startswith('echo "make: installing '), (commands[index], announced)

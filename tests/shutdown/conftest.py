"""Fixtures for shutdown tests with real `python -m service` processes, and a summary of their measured exits."""

from __future__ import annotations

import pytest

from .harness import MEASURED_EXITS, ServerProcess


@pytest.fixture
def start_server():
    """`start_server(repository, *flags) -> ServerProcess`; every process still running at the end is killed."""
    servers: list[ServerProcess] = []

    def start(repository, *flags: str) -> ServerProcess:
        server = ServerProcess(repository, *flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
        print(f"---- log of the server on {server.address} ----\n{server.log}")  # shown when the test failed


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not MEASURED_EXITS:
        return
    write = terminalreporter.write_line
    write("")
    write("shutdown: seconds from the first signal to the process's exit (bound asserted)")
    for name, seconds, bound in MEASURED_EXITS:
        write(f"  {seconds:6.2f} s  (bound {bound:5.1f} s)  {name}")

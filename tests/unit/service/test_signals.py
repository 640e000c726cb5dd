"""The stop-signal rules (service/signals.py), decided without a process. The real signals are sent to real
server processes in tests/shutdown/test_signals.py."""

from __future__ import annotations

import signal

import pytest

from service.signals import Decision, decide


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_while_serving_starts_the_shutdown(signum):
    assert decide(signum, shutting_down=False) is Decision.START_SHUTDOWN


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_while_shutting_down_changes_nothing(signum):
    assert decide(signum, shutting_down=True) is Decision.IGNORE


def test_sigint_while_shutting_down_exits_now():
    assert decide(signal.SIGINT, shutting_down=True) is Decision.EXIT_NOW


@pytest.mark.parametrize("shutting_down", [False, True])
def test_sigquit_exits_now_whatever_the_state(shutting_down):
    assert decide(signal.SIGQUIT, shutting_down=shutting_down) is Decision.EXIT_NOW

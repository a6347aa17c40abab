"""The triggerer's clean-stop hook: used on the Airflow releases it was measured on, out of the way elsewhere.

Runs in every leg of the compatibility matrix (.ci/compat): on each supported Airflow the hook is used exactly
when that release is in ``TESTED_AIRFLOW``. The measured 0 lost / 0 doubled on SIGTERM is
tests/test_airflow_deployment.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
from pathlib import Path

import pytest

from airflow_jetstream.airflow_compat import airflow_version
from airflow_jetstream.triggers import stop_drain
from airflow_jetstream.triggers.stop_drain import TESTED_AIRFLOW, _StopDrain

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints"


class Producer:
    """A shared stream's producer: messages handed out and not yet acked until Airflow confirms their events."""

    def __init__(self) -> None:
        self.paused = asyncio.Event()
        self.left = 3

    def pause(self) -> None:
        self.paused.set()

    def unsettled(self) -> int:
        return self.left


@pytest.fixture
def airflow_handler():
    """Stands in for the trigger runner's own SIGTERM handler, which the hook runs after the drain."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGTERM, previous)


def test_on_a_tested_release_sigterm_waits_for_the_last_acks_then_reaches_airflow(airflow_handler, monkeypatch):
    monkeypatch.setattr(stop_drain, "DRAIN_SECONDS", 120.0)  # the drain ends on the acks below, not on time
    hook = _StopDrain(tested=frozenset({airflow_version()}))
    installed = signal.getsignal(signal.SIGTERM)

    async def scenario() -> list[int]:
        producer = Producer()
        assert hook.register(producer)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(producer.paused.wait(), 30)
        held = list(airflow_handler)  # Airflow has not seen the signal while messages are unsettled
        producer.left = 0  # Airflow confirmed the stored events; their messages were acked
        assert hook.task is not None
        await asyncio.wait_for(hook.task, 30)
        hook.unregister(producer)
        return held

    assert asyncio.run(scenario()) == []
    assert airflow_handler == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is installed  # Airflow's handler is back


def test_on_another_release_the_hook_leaves_the_signals_alone_with_one_warning(airflow_handler, caplog):
    hook = _StopDrain(tested=frozenset({(3, 0, 0)}))
    installed = signal.getsignal(signal.SIGTERM)

    async def scenario() -> list[bool]:
        return [hook.register(Producer()) for _ in range(3)]

    with caplog.at_level(logging.WARNING, logger=stop_drain.__name__):
        assert asyncio.run(scenario()) == [False, False, False]
    assert signal.getsignal(signal.SIGTERM) is installed
    warned = [r.getMessage() for r in caplog.records if "Clean-stop hook not used" in r.getMessage()]
    assert len(warned) == 1
    assert "tested on Airflow 3.0.0" in warned[0] and f"this is Airflow {'.'.join(map(str, airflow_version()))}" \
        in warned[0]


def test_the_hook_is_used_on_exactly_the_tested_releases(airflow_handler):
    """Per supported Airflow (each compat leg): hooked on a tested release, a no-op on any other."""

    async def scenario() -> tuple[bool, bool]:
        hook, producer = _StopDrain(), Producer()
        used = hook.register(producer)
        replaced = signal.getsignal(signal.SIGTERM) == hook._on_signal
        hook.unregister(producer)
        return used, replaced

    tested = airflow_version() in TESTED_AIRFLOW
    assert asyncio.run(scenario()) == (tested, tested)


def test_the_pinned_airflow_is_a_tested_release():
    """Moving the constraints pin needs the deployment test on the new release, then TESTED_AIRFLOW updated."""
    pins = {tuple(int(part) for part in found.split("."))
            for path in CONSTRAINTS.glob("constraints-3.*.txt")
            for found in re.findall(r"^apache-airflow==([\d.]+)$", path.read_text(), flags=re.M)}
    assert pins and pins <= TESTED_AIRFLOW

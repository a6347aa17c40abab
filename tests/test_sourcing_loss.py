"""50k messages sourced from WorkQueue and Interest origins arrive exactly once and leave the origin."""

from __future__ import annotations

import pytest

from airflow_jetstream.client import ensure_stream
from airflow_jetstream.client.sourcing.provision import DurableSource, provision_durable_source
from tests.test_sourcing import assert_exactly_once, payloads, publish, run, wait_sourced

TOTAL = 50_000


@pytest.mark.parametrize("mode", ["server", "user"])
@pytest.mark.parametrize("retention", ["workqueue", "interest"])
def test_50k_messages_arrive_exactly_once_and_leave_the_origin(mode, retention, settings):
    async def go(conn) -> dict:
        await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"], "retention": retention})
        await ensure_stream(conn, {"name": "AGG", "subjects": ["agg.>"]})
        if retention == "workqueue":
            await publish(conn, "o", TOTAL // 2)  # half waits in the origin, half arrives while sourcing
        result = await provision_durable_source(conn, DurableSource("AGG", "ORIGIN", mode=mode))
        start = TOTAL // 2 if retention == "workqueue" else 0
        await publish(conn, "o", TOTAL - start, start=start)
        await wait_sourced(conn, "AGG", "ORIGIN", TOTAL, timeout=120)
        result["seen"] = await payloads(conn, "AGG")
        return result

    result = run(settings, go)
    assert result["mode"] == mode
    assert_exactly_once(result["seen"], "o", TOTAL)
    assert sum(result["seen"].values()) == TOTAL

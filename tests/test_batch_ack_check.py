"""An atomic batch's commit ack must name the batch and its size (orbit.go's ErrInvalidBatchAck): an ack for
another batch or count is not proof the batch is stored, so it is ``invalid_batch_ack``, never a result.

A real nats-server never sends such an ack, so a plain subscriber stands in for the stream on a subject no
stream captures and answers the commit with what the test gives it.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_jetstream.client import BatchMessage, publish_atomic_batch
from airflow_jetstream.client.batches.types import HEADER_BATCH_COMMIT, HEADER_BATCH_ID
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import BatchPublishError
from airflow_jetstream.client.settings import ConnectionSettings


def _publish_answered_with(nats_server, commit_ack) -> object:
    """Publish a 3-message atomic batch (id ``b1``) whose commit is answered with ``commit_ack(batch_id)``."""
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=2)

    async def main():
        async with open_connection(settings) as conn:
            async def stand_in(msg) -> None:
                if msg.reply:
                    commit = HEADER_BATCH_COMMIT in (msg.headers or {})
                    body = json.dumps(commit_ack(msg.headers[HEADER_BATCH_ID])).encode() if commit else b""
                    await conn.nc.publish(msg.reply, body)

            await conn.nc.subscribe("fakeatom.>", cb=stand_in)
            await conn.nc.flush()
            messages = [BatchMessage("fakeatom.x", b"%d" % i) for i in range(3)]
            try:
                return await publish_atomic_batch(conn, messages, batch_id="b1", retries=0)
            except BatchPublishError as exc:
                return exc

    return asyncio.run(main())


@pytest.mark.parametrize("ack", [
    {"stream": "FAKE", "seq": 10, "batch": "another", "count": 3},
    {"stream": "FAKE", "seq": 10, "batch": "b1", "count": 2},
    {"stream": "FAKE", "seq": 10, "batch": "b1"},
    {"stream": "FAKE", "batch": "b1", "count": 3},
], ids=["other_batch", "other_count", "no_count", "no_seq"])
def test_a_commit_ack_for_another_batch_or_count_is_refused(nats_server, ack) -> None:
    outcome = _publish_answered_with(nats_server, lambda _batch_id: ack)
    assert isinstance(outcome, BatchPublishError), outcome
    assert outcome.reason == "invalid_batch_ack"
    assert "atomic batch b1" in outcome.message and "unknown" in outcome.message


def test_the_matching_commit_ack_is_the_result(nats_server) -> None:
    result = _publish_answered_with(nats_server, lambda batch_id: {"stream": "FAKE", "seq": 12, "batch": batch_id,
                                                                   "count": 3})
    assert result.to_dict() == {**result.to_dict(), "batch": "b1", "count": 3, "first_seq": 10, "last_seq": 12}

"""10158 "duplicate message id is in process": a clustered stream's answer to a publish whose msg id
is still being stored (proposed, not yet applied). It says nothing about whether the id is stored, so
the msg-id probes and the Batcher ask again instead of reading it as "not stored" or failing.

No stream can be made to answer 10158 on demand, so a scripted responder on a real nats-server
answers the first request with 10158 and the next with the duplicate ack the stream would send.
"""

from __future__ import annotations

import asyncio
import json

from airflow_jetstream.client.batches.batcher import Batcher
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.batches.wire import stored_sequences
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import BatchPublishError, error_from_api
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer

IN_PROCESS = {"error": {"code": 409, "err_code": 10158, "description": "duplicate message id is in process"}}


def test_10158_is_a_typed_msg_id_in_process_error() -> None:
    err = error_from_api(IN_PROCESS["error"], context="publish")
    assert isinstance(err, BatchPublishError)
    assert err.reason == "msg_id_in_process" and err.err_code == 10158
    assert "asking again shortly is safe" in err.message


def _with_in_process_responder(server: EmbeddedNatsServer, subject: str, seq: int, body):
    """Run ``body(conn)`` while a responder on ``subject`` answers each msg id's first request with
    10158 and every later one with a duplicate ack at ``seq``; returns (body's result, msg ids asked)."""
    settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3, leader_wait=30)
    calls: list[str] = []

    async def main():
        async with open_connection(settings) as conn:
            async def answer(msg) -> None:
                msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
                reply = IN_PROCESS if msg_id not in calls else {"stream": "S", "seq": seq, "duplicate": True}
                calls.append(msg_id)
                await conn.nc.publish(msg.reply, json.dumps(reply).encode())

            await conn.nc.subscribe(subject, cb=answer)
            return await body(conn)

    return asyncio.run(main()), calls


def test_msg_id_probe_asks_again_after_10158(nats_server: EmbeddedNatsServer) -> None:
    seqs, calls = _with_in_process_responder(
        nats_server, "inproc.p", 7, lambda conn: stored_sequences(conn, [BatchMessage("inproc.p", b"", msg_id="m1")]))
    assert seqs == [7], "a 10158 must not be read as 'not stored'"
    assert calls == ["m1", "m1"]


def test_batcher_re_sends_an_item_refused_with_10158(nats_server: EmbeddedNatsServer) -> None:
    async def publish(conn):
        async with Batcher(conn, max_batch=1, flush_interval=60, fence=False) as batcher:
            return await batcher.publish("inproc.b", b"x", msg_id="b1")

    result, calls = _with_in_process_responder(nats_server, "inproc.b", 11, publish)
    assert (result.error, result.seq, result.duplicate) == ("", 11, True)
    assert calls == ["b1", "b1"]

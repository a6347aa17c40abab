"""What an asset event stores of a JetStream message (Airflow keeps every event in its metadata DB): the body
once (``json`` when it is JSON, else ``data``), and at most EVENT_BODY_LIMIT bytes of it, with a note when cut."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.reading.messages import EVENT_BODY_LIMIT, Message, body_fields
from airflow_jetstream.triggers.message import JetStreamMessageTrigger, message_payload


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"order": 7}', {"json": {"order": 7}, "encoding": "json", "size": 12}),
    (b"42", {"json": 42, "encoding": "json", "size": 2}),
    (b"plain text", {"data": "plain text", "encoding": "utf-8", "size": 10}),
    (b"NaN", {"data": "NaN", "encoding": "utf-8", "size": 3}),  # Python reads it, a JSON column does not
    (b"", {"data": "", "encoding": "utf-8", "size": 0}),
    (b"\xff\x00", {"data": "/wA=", "encoding": "base64", "size": 2}),
], ids=["json", "json_number", "text", "nan", "empty", "binary"])
def test_the_body_is_carried_once(body: bytes, expected: dict) -> None:
    assert body_fields(body) == expected


def test_a_long_body_is_cut_with_a_note_saying_where_the_whole_message_is() -> None:
    text = json.dumps({"rows": ["é" * 50] * 40})  # 2-byte characters: the cut falls inside one or not
    body = text.encode()
    for limit in (100, 101):
        fields = body_fields(body, limit=limit, where="stream 'ORDERS' at sequence 9")
        assert fields["encoding"] == "utf-8" and "json" not in fields
        assert body.startswith(fields["data"].encode()) and limit - 1 <= len(fields["data"].encode()) <= limit
        assert fields["size"] == len(body)
        assert fields["truncated"] == (f"the body is {len(body)} bytes; only its first {limit} are kept here (event "
                                       "payload limit): read the whole message from stream 'ORDERS' at sequence 9")
    binary = b"\xff\xfe" * 256
    cut = body_fields(binary, limit=10)
    assert base64.b64decode(cut["data"]) == binary[:10] and cut["encoding"] == "base64" and "truncated" in cut


def test_asset_event_payloads_from_a_real_stream(nats_server) -> None:
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=5)
    big = json.dumps({"blob": "x" * EVENT_BODY_LIMIT}).encode()

    async def main() -> list[dict]:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "EVT", "subjects": ["evt.>"]})
            for body in (b'{"order": 1}', b"hello", big):
                await conn.js.publish("evt.a", body)
            sub = await conn.js.pull_subscribe("evt.a", durable="evt", stream="EVT")
            msgs = await sub.fetch(3, timeout=5)
            for msg in msgs:
                await msg.ack()
            return [message_payload(Message.from_delivery(msg)) for msg in msgs]

    as_json, text, cut = asyncio.run(main())
    assert as_json["json"] == {"order": 1} and "data" not in as_json
    assert text["data"] == "hello" and "json" not in text
    assert cut["size"] == len(big) and len(cut["data"]) == EVENT_BODY_LIMIT and "json" not in cut
    assert "read the whole message from stream 'EVT' at sequence 3" in cut["truncated"]
    assert len(json.dumps(cut)) < EVENT_BODY_LIMIT + 1024


def test_an_advisory_event_carries_the_advisory_once() -> None:
    trigger = JetStreamMessageTrigger(stream="ADVISORIES", consumer="c", advisory="stream_created")
    body = {"type": "io.nats.jetstream.advisory.v1.stream_action", "action": "create", "stream": "WATCHED",
            "id": "x", "timestamp": "2026-11-26T00:00:00Z"}
    message = Message(stream="ADVISORIES", subject="$JS.EVENT.ADVISORY.STREAM.CREATED.WATCHED", seq=4,
                      data=json.dumps(body).encode())
    event = trigger.event_for(message)
    assert event is not None
    assert event.payload["advisory"]["stream"] == "WATCHED" and "json" not in event.payload
    assert event.payload["advisory"]["advisory_kind"] == "stream_created"

"""What an asset event stores of a JetStream message (Airflow logs every event in the triggerer and keeps it in its
metadata DB): by default where the message is, read back by the task; with ``body_in_event`` the body once
(``json`` when it is JSON, else ``data``), and at most EVENT_BODY_LIMIT bytes of it, with a note when cut."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.errors import JetStreamError
from airflow_jetstream.client.reading.messages import EVENT_BODY_LIMIT, Message, body_fields
from airflow_jetstream.message_events import asset_messages
from airflow_jetstream.triggers.message import EVENT_REFERENCE, JetStreamMessageTrigger, message_payload


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


def test_a_stored_time_is_cut_to_microseconds_never_rounded_past_the_message() -> None:
    """A read from a message's own time (``start_time``) finds the message: its time is never later than stored."""
    nanos = 1_700_000_000_999_999_999  # ns since the epoch; as a float of seconds it rounds up to the next second
    message = Message.from_stored("S", ("s.a", 1, nanos, None, b""))
    assert message.time == datetime(2023, 11, 14, 22, 13, 20, 999999, tzinfo=UTC)


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


#: A body with personal data: no event may carry it by default (Airflow's triggerer logs every event).
PERSONAL = b'{"order": 5, "ssn": "078-05-1120"}'


def _delivered(settings: ConnectionSettings, stream: str, config: dict, body: bytes) -> Message:
    """The message a watcher gets, published with ``body`` (and an Authorization header)."""
    async def main() -> Message:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream.lower()}.>"], **config})
            await conn.js.publish(f"{stream.lower()}.a", body, headers={"Authorization": "Bearer planted-7c1d"})
            sub = await conn.js.pull_subscribe(f"{stream.lower()}.a", durable="w", stream=stream)
            (msg,) = await sub.fetch(1, timeout=5)
            await msg.ack_sync()
            return Message.from_delivery(msg)

    return asyncio.run(main())


def test_an_event_carries_where_the_message_is_and_the_task_reads_the_body_back(nats_server, nats_conn) -> None:
    """``Trigger fired event ... result=<payload>`` is in the triggerer's log and the asset event in Airflow's
    database: both hold the reference only; ``asset_messages`` gives the task the payload the watcher saw."""
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=5)
    delivered = _delivered(settings, "PII", {}, PERSONAL)
    trigger = JetStreamMessageTrigger(stream="PII", consumer="w")
    event = trigger.event_for(delivered)
    assert event is not None and set(event.payload) == set(EVENT_REFERENCE)
    logged = json.dumps(event.payload)
    assert "078-05-1120" not in logged and "planted-7c1d" not in logged, logged
    assert trigger.serialize()[1]["body_in_event"] is False

    asset = object()
    stored = SimpleNamespace(timestamp=datetime.now(UTC), extra={"payload": event.payload})
    (read,) = asset_messages(asset, {asset: [stored]})
    assert read == message_payload(delivered), "the same payload as with the body in the event"

    opted_in = JetStreamMessageTrigger(stream="PII", consumer="w", body_in_event=True).event_for(delivered)
    assert opted_in is not None and opted_in.payload == read and "078-05-1120" in json.dumps(opted_in.payload)


def test_a_message_gone_before_the_task_reads_it_is_a_typed_error(nats_server, nats_conn) -> None:
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=5)
    delivered = _delivered(settings, "PII_WQ", {"retention": "workqueue"}, PERSONAL)  # the ack removed it
    event = JetStreamMessageTrigger(stream="PII_WQ", consumer="w").event_for(delivered)
    asset = object()
    stored = SimpleNamespace(timestamp=datetime.now(UTC), extra={"payload": event.payload})
    with pytest.raises(JetStreamError, match="body_in_event=True") as gone:
        asset_messages(asset, {asset: [stored]})
    assert gone.value.reason == "message_gone"

"""process_each_once against a real nats-server; asset_messages over this run's and the stranded events."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_jetstream.client import ConnectionSettings
from airflow_jetstream.client.kv import get_key
from airflow_jetstream.message_events import asset_messages, process_each_once
from tests.support.nats_calls import call_on_server
from tests.support.polling import wait_until

BUCKET = "processed_once"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def message(seq: int, delivered: int = 1) -> dict[str, Any]:
    return {"stream": "ORDERS", "consumer": "c", "subject": "orders.ready", "stream_seq": seq,
            "delivered": delivered, "json": {"order": seq}}


def test_each_stream_sequence_is_processed_by_one_call_only(settings: ConnectionSettings, nats_conn: str) -> None:
    seen: list[int] = []
    first = process_each_once([message(1), message(2)], lambda m: seen.append(m["stream_seq"]), bucket=BUCKET)
    # a repeat (delivered 2) and a new message: only the new one is processed
    second = process_each_once([message(2, delivered=2), message(3)], lambda m: seen.append(m["stream_seq"]),
                               bucket=BUCKET)
    assert first == {"processed": [1, 2], "repeated": []}
    assert second == {"processed": [3], "repeated": [2]}
    assert seen == [1, 2, 3]
    claim = call_on_server(settings, get_key, BUCKET, "ORDERS.2")
    stored = json.loads(claim["value"])
    assert claim is not None and stored.pop("claim_id") and stored == {"subject": "orders.ready", "delivered": 1}


def test_a_failed_work_releases_its_claim_for_the_retry(settings: ConnectionSettings, nats_conn: str) -> None:
    def fail_on_5(m: dict[str, Any]) -> None:
        if m["stream_seq"] == 5:
            raise ValueError("downstream refused order 5")

    with pytest.raises(ValueError, match="order 5"):
        process_each_once([message(4), message(5)], fail_on_5, bucket=BUCKET)
    assert call_on_server(settings, get_key, BUCKET, "ORDERS.5") is None, "the claim of the failed message is gone"
    retry = process_each_once([message(4), message(5)], lambda m: None, bucket=BUCKET)
    assert retry == {"processed": [5], "repeated": [4]}


class StoredEvents:
    """What ``inlet_events[asset]`` answers in a task: the asset's stored events, filtered server-side."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.asked: dict[str, Any] = {}

    def __getitem__(self, asset: Any) -> StoredEvents:
        return self

    def after(self, after: str) -> StoredEvents:
        self.asked["after"] = after
        return self

    def ascending(self, ascending: bool = True) -> StoredEvents:
        self.asked["ascending"] = ascending
        return self

    def limit(self, limit: int) -> StoredEvents:
        self.asked["limit"] = limit
        return self

    def __iter__(self):
        after = datetime.fromisoformat(self.asked["after"])
        return iter([e for e in self.events if e.timestamp > after][: self.asked["limit"]])


def event(seq: int, seconds: int, delivered: int = 1) -> Any:
    return SimpleNamespace(timestamp=T0 + timedelta(seconds=seconds), extra={"payload": message(seq, delivered)})


def test_asset_messages_adds_the_events_stored_after_the_runs_first_one() -> None:
    asset = object()
    own = [event(11, 10), event(12, 11)]
    stored = StoredEvents([event(10, 5), *own, event(12, 12, delivered=2), event(13, 13), event(14, 14)])
    messages = asset_messages(asset, {asset: own}, stored, limit=100)
    assert [(m["stream_seq"], m["delivered"]) for m in messages] == [(11, 1), (12, 1), (13, 1), (14, 1)]
    assert stored.asked == {"after": own[0].timestamp.isoformat(), "ascending": True, "limit": 100}
    # without inlet events: the run's own; a run without events of the asset: none
    assert [m["stream_seq"] for m in asset_messages(asset, {asset: own})] == [11, 12]
    assert asset_messages(asset, {}, stored) == []


class StaleClaim(Exception):
    """An output write with a claim token lower than one already written."""


def test_a_run_held_past_the_claim_ttl_neither_replaces_nor_releases_the_later_runs_work(
        settings: ConnectionSettings, nats_conn: str) -> None:
    """The server ends a claim at the bucket's ttl; a later run claims the message again with a higher
    ``claim_revision`` and processes it. The held run, resumed, cannot replace that output (the output store keeps
    the highest token) and its failure deletes nothing of the later run's claim (the delete is a compare-and-set
    on its own claim's revision)."""
    outputs: dict[int, int] = {}  # an output store fenced by the token: stream_seq -> highest claim_revision

    def write(m: dict[str, Any]) -> None:
        if m["claim_revision"] < outputs.get(m["stream_seq"], 0):
            raise StaleClaim(f"claim {m['claim_revision']} is older than {outputs[m['stream_seq']]}")
        outputs[m["stream_seq"]] = m["claim_revision"]

    held, resume = threading.Event(), threading.Event()

    def held_work(m: dict[str, Any]) -> None:
        held.set()
        assert resume.wait(60), "the test resumes the held run"
        write(m)

    bucket = "processed_ttl"
    with ThreadPoolExecutor(1) as pool:
        zombie = pool.submit(process_each_once, [message(7)], held_work, bucket=bucket, ttl=1)
        assert held.wait(60), "the held run claimed the message"
        wait_until(lambda: call_on_server(settings, get_key, bucket, "ORDERS.7") is None,
                   "the server to end the held run's claim (ttl 1 s)", timeout=30, every=0.2)
        later = process_each_once([message(7, delivered=2)], write, bucket=bucket, ttl="1h")
        resume.set()
        with pytest.raises(StaleClaim):
            zombie.result(60)
    assert later == {"processed": [7], "repeated": []}
    claim = call_on_server(settings, get_key, bucket, "ORDERS.7")
    assert claim is not None and claim["revision"] == outputs[7], "the later run's claim and output stay"

"""client/advisory_types, advisory_filter and advisories: parsing, subjects, filters (unit) and the capture stream
(real nats-server)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from airflow_jetstream.client import ensure_stream, open_connection
from airflow_jetstream.client.advisories.capture import (
    capture_gap,
    capture_stream_config,
    ensure_capture_stream,
    find_captured,
    listen_live,
    watch_advisories,
)
from airflow_jetstream.client.advisories.types import (
    KINDS,
    Advisory,
    AdvisoryFilter,
    AdvisoryPredicateError,
    advisory_subject,
    decode_advisory,
    parse_advisory,
    predicate_path,
)
from airflow_jetstream.client.errors import InvalidRequestError, InvalidSubjectError, StreamNotFoundError
from airflow_jetstream.client.subjects import subject_matches
from tests.support.catch_up_gate import held_at_the_gate
from tests.support.polling import async_wait_until

T = "io.nats.jetstream.advisory.v1."


def only_batch_b2(advisory: dict) -> bool:
    return advisory.get("batch") == "b2"


def exploding_predicate(advisory: dict) -> bool:
    raise ValueError("boom")


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("data", "kind", "checks"),
    [
        ({"type": T + "stream_action", "stream": "S", "action": "create"}, "stream_created",
         {"action": "create"}),
        ({"type": T + "stream_action", "stream": "S", "action": "modify"}, "stream_updated", {}),
        ({"type": T + "stream_action", "stream": "S", "action": "delete"}, "stream_deleted", {}),
        ({"type": T + "consumer_action", "stream": "S", "consumer": "C", "action": "create"},
         "consumer_created", {}),
        ({"type": T + "max_deliver", "stream": "S", "consumer": "C", "stream_seq": 7, "deliveries": 3},
         "max_deliveries", {"stream_seq": 7, "deliveries": 3}),
        ({"type": T + "nak", "stream": "S", "consumer": "C", "consumer_seq": 1, "stream_seq": 2, "deliveries": 1},
         "msg_naked", {"consumer_seq": 1}),
        ({"type": T + "terminated", "stream": "S", "consumer": "C", "stream_seq": 2, "reason": "bad"},
         "msg_terminated", {"reason": "bad"}),
        ({"type": T + "consumer_pause", "stream": "S", "consumer": "C", "paused": True,
          "pause_until": "2030-01-01T00:00:00.123456789Z"}, "consumer_pause",
         {"paused": True, "pause_until": datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)}),
        ({"type": T + "consumer_group_pinned", "group": "g", "pinned_id": "p"}, "consumer_pinned",
         {"pinned_id": "p"}),
        ({"type": T + "consumer_group_unpinned", "group": "g", "reason": "timeout"}, "consumer_unpinned",
         {"reason": "timeout"}),
        ({"type": T + "stream_batch_abandoned", "stream": "S", "batch": "b1", "reason": "timeout"},
         "batch_abandoned", {"batch": "b1", "reason": "timeout"}),
        ({"type": T + "api_audit", "subject": "$JS.API.INFO", "server": "n1"}, "api_audit",
         {"api_subject": "$JS.API.INFO"}),
        ({"type": T + "api_limit_reached", "server": "n1", "dropped": 5}, "api_limit_reached", {"dropped": 5}),
        ({"type": T + "stream_leader_elected", "stream": "S", "leader": "n2"}, "stream_leader_elected",
         {"leader": "n2"}),
        ({"type": T + "consumer_leader_elected", "stream": "S", "consumer": "C"}, "consumer_leader_elected", {}),
        ({"type": T + "domain_leader_elected", "leader": "n1"}, "domain_leader_elected", {}),
        ({"type": T + "stream_quorum_lost", "stream": "S"}, "stream_quorum_lost", {}),
        ({"type": T + "consumer_quorum_lost", "stream": "S", "consumer": "C"}, "consumer_quorum_lost", {}),
        ({"type": T + "snapshot_create", "stream": "S"}, "snapshot_create", {}),
        ({"type": T + "snapshot_complete", "stream": "S"}, "snapshot_complete", {}),
        ({"type": T + "restore_create", "stream": "S"}, "restore_create", {}),
        ({"type": T + "restore_complete", "stream": "S", "bytes": 10}, "restore_complete", {"bytes": 10}),
        ({"type": T + "server_out_of_space", "server": "n1"}, "server_out_of_storage", {"server": "n1"}),
        ({"type": T + "server_removed", "server": "n1"}, "server_removed", {}),
        ({"type": "io.nats.jetstream.metric.v1.consumer_ack", "stream": "S", "consumer": "C", "ack_time": 5},
         "consumer_ack", {"ack_time": 5}),
    ],
)
def test_parse_every_known_type(data, kind, checks):
    advisory = parse_advisory({"id": "x", "timestamp": "2026-11-25T23:48:41.681044961Z", **data}, subject="s.x")
    assert advisory.kind == kind
    assert advisory.timestamp == datetime(2026, 11, 25, 23, 48, 41, 681044, tzinfo=UTC)
    for name, value in checks.items():
        assert getattr(advisory, name) == value
    out = advisory.to_dict()
    assert out["advisory_kind"] == kind and out["type"] == data["type"]
    json.dumps(out)


def test_every_kind_parses_back_to_itself_with_its_fields():
    for kind in KINDS.values():
        advisory = parse_advisory({"type": kind.type, "action": kind.action})
        assert advisory.kind == kind.name
        assert set(advisory.fields) == set(kind.fields)
    with pytest.raises(AttributeError, match="batch_abandoned advisory has no field 'stream_seq'"):
        _ = parse_advisory({"type": T + "stream_batch_abandoned"}).stream_seq
    assert parse_advisory({"type": T + "stream_action", "action": "rename"}).kind is None


def test_unknown_and_malformed_advisories_never_crash():
    unknown = parse_advisory({"type": "io.nats.jetstream.advisory.v9.brand_new", "x": 1})
    assert type(unknown) is Advisory and unknown.kind is None and unknown.fields == {}
    assert unknown.to_dict()["x"] == 1
    weird = parse_advisory({"type": T + "max_deliver", "stream_seq": "not a number", "timestamp": "yesterday",
                            "stream": 5})
    assert weird.stream_seq is None and weird.timestamp is None and weird.stream is None
    assert decode_advisory(b"not json") is None
    assert decode_advisory(b"[1, 2]") is None
    assert decode_advisory(b"") is None


# ------------------------------------------------------------------ subjects and filters


def test_subject_builders():
    assert advisory_subject("batch_abandoned", "ORDERS") == "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.ORDERS"
    assert advisory_subject("max_deliveries", "S") == "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.S.*"
    assert advisory_subject("max_deliveries", "S", "C") == "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.S.C"
    assert advisory_subject("api_audit") == "$JS.EVENT.ADVISORY.API"
    assert advisory_subject("consumer_ack", "S", "C") == "$JS.EVENT.METRIC.CONSUMER.ACK.S.C"
    with pytest.raises(InvalidRequestError) as err:
        advisory_subject("batch_abandonned")
    assert err.value.reason == "unknown_advisory" and "batch_abandoned" in err.value.message
    with pytest.raises(InvalidSubjectError):
        advisory_subject("batch_abandoned", "BAD.NAME")


def test_subject_matches():
    assert subject_matches("a.*.c", "a.b.c")
    assert not subject_matches("a.*.c", "a.b.d")
    assert subject_matches("a.>", "a.b.c")
    assert not subject_matches("a.>", "a")
    assert not subject_matches("a.b", "a.b.c")


def _abandoned(batch="b1", stream="ORDERS", reason="timeout"):
    return parse_advisory({"type": T + "stream_batch_abandoned", "stream": stream, "batch": batch, "reason": reason},
                          subject=f"$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.{stream}")


def test_filter_by_kind_stream_batch_reason_and_match():
    assert AdvisoryFilter(advisory="batch_abandoned").matches(_abandoned())
    assert not AdvisoryFilter(advisory="max_deliveries").matches(_abandoned())
    assert AdvisoryFilter(advisory="batch_abandoned", stream="ORDERS").matches(_abandoned())
    assert not AdvisoryFilter(advisory="batch_abandoned", stream="OTHER").matches(_abandoned())
    assert not AdvisoryFilter(batch="b2").matches(_abandoned())
    assert AdvisoryFilter(reason="timeout").matches(_abandoned())
    assert not AdvisoryFilter(reason="large").matches(_abandoned())
    assert AdvisoryFilter(match={"batch": "b1"}).matches(_abandoned())
    assert not AdvisoryFilter(match={"batch": "b1", "reason": "large"}).matches(_abandoned())
    by_subject = AdvisoryFilter(advisory="$JS.EVENT.ADVISORY.STREAM.>")
    assert by_subject.matches(_abandoned()) and by_subject.subject() == "$JS.EVENT.ADVISORY.STREAM.>"
    assert not AdvisoryFilter(advisory="$JS.EVENT.ADVISORY.CONSUMER.>").matches(_abandoned())
    assert AdvisoryFilter().subject() == "$JS.EVENT.ADVISORY.>"


def test_filter_with_importable_predicate():
    flt = AdvisoryFilter(advisory="batch_abandoned", match=f"{__name__}.only_batch_b2")
    assert flt.matches(_abandoned("b2")) and not flt.matches(_abandoned("b1"))
    assert AdvisoryFilter.from_dict(flt.to_dict()) == flt
    assert predicate_path(only_batch_b2) == f"{__name__}.only_batch_b2"
    with pytest.raises(AdvisoryPredicateError, match="cannot be found again by a dotted path"):
        predicate_path(lambda advisory: True)
    with pytest.raises(AdvisoryPredicateError, match="cannot import"):
        AdvisoryFilter(match="no_such_module_xyz.func")
    with pytest.raises(AdvisoryPredicateError, match="does not name a callable"):
        AdvisoryFilter(match=f"{__name__}.T")
    with pytest.raises(AdvisoryPredicateError) as err:
        AdvisoryFilter(match=f"{__name__}.exploding_predicate").matches(_abandoned())
    assert err.value.reason == "predicate_failed" and "boom" in err.value.message


def test_filter_rejects_bad_input_before_anything_is_sent():
    with pytest.raises(InvalidRequestError) as err:
        AdvisoryFilter(advisory="nope")
    assert err.value.reason == "unknown_advisory"
    with pytest.raises(InvalidSubjectError):
        AdvisoryFilter(advisory="$JS.EVENT.ADVISORY..X")
    with pytest.raises(InvalidSubjectError):
        AdvisoryFilter(stream="a.b")
    with pytest.raises(AdvisoryPredicateError):
        AdvisoryFilter(match=42)


def test_capture_stream_config_needs_a_retention_limit():
    config = capture_stream_config("ADV", max_age="1h")
    assert config["subjects"] == ["$JS.EVENT.ADVISORY.*.>"] and config["max_age"] == 3_600_000_000_000
    assert config["allow_direct"] is True
    assert capture_stream_config("ADV", max_age=None, max_bytes=1024)["max_bytes"] == 1024
    with pytest.raises(InvalidRequestError) as err:
        capture_stream_config("ADV", max_age=None)
    assert err.value.reason == "missing_retention"
    with pytest.raises(InvalidRequestError):
        capture_stream_config("ADV", subjects=["orders.>"])


def test_capture_gap_explains_missing_history():
    since = datetime(2026, 1, 1, tzinfo=UTC)
    late = {"config": {"name": "ADV"}, "created": "2026-01-02T00:00:00Z", "state": {}}
    assert "created" in capture_gap(late, since)
    expired = {"config": {"name": "ADV"}, "created": "2025-01-01T00:00:00Z",
               "state": {"first_seq": 50, "first_ts": "2026-01-03T00:00:00Z"}}
    assert "expired" in capture_gap(expired, since)
    fine = {"config": {"name": "ADV"}, "created": "2025-01-01T00:00:00Z",
            "state": {"first_seq": 1, "first_ts": "2026-01-03T00:00:00Z"}}
    assert capture_gap(fine, since) is None


# ------------------------------------------------------------------ against a real server


def test_capture_stream_finds_advisory_published_before_reading(settings):
    async def scenario():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, capture_stream_config("ADVISORIES", max_age="1h"))
            since = datetime.now(UTC)
            await ensure_stream(conn, {"name": "ORDERS", "subjects": ["orders.>"]})
            await ensure_stream(conn, {"name": "OTHER", "subjects": ["other.>"]})
            found: dict = {}

            async def captured() -> bool:  # the server publishes an advisory after its API reply: not stored yet
                found["created"] = await find_captured(
                    conn, "ADVISORIES", start_time=since,
                    advisory_filter=AdvisoryFilter(advisory="stream_created", stream="OTHER"))
                return found["created"]["advisory"] is not None

            await async_wait_until(captured, "the capture stream to store OTHER's stream_created advisory")
            created = found["created"]
            missing = await find_captured(conn, "ADVISORIES", start_time=since,
                                          advisory_filter=AdvisoryFilter(advisory="stream_deleted"))
            later = await find_captured(conn, "ADVISORIES", start_time=datetime.now(UTC) + timedelta(hours=1),
                                        advisory_filter=AdvisoryFilter(advisory="stream_created"))
            too_early = await find_captured(conn, "ADVISORIES", start_time=since - timedelta(hours=1),
                                            advisory_filter=AdvisoryFilter(advisory="stream_created", stream="ORDERS"))
            return created, missing, later, too_early

    created, missing, later, too_early = asyncio.run(scenario())
    assert too_early["advisory"]["stream"] == "ORDERS" and "never captured" in too_early["gap"]
    assert created["advisory"]["stream"] == "OTHER" and created["advisory"]["advisory_kind"] == "stream_created"
    assert created["advisory"]["capture_seq"] >= 1 and created["gap"] is None
    assert missing["advisory"] is None
    assert later["advisory"] is None and later["scanned"] == 0


def test_a_watch_reads_what_was_captured_only_when_its_turn_to_catch_up_comes(settings):
    """A watch reads what the capture stream stored from ``start_time`` until it joined the stream's shared tail
    inside ``listener.catching_up()``: a thousand deferred advisory sensors starting together read their backlog
    CATCH_UP_AT_ONCE at a time. An advisory already captured fires only once a turn is free."""

    async def scenario():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, capture_stream_config("ADVISORIES", max_age="1h"))
            since = datetime.now(UTC)
            await ensure_stream(conn, {"name": "GATED", "subjects": ["gated.>"]})
            created = AdvisoryFilter(advisory="stream_created", stream="GATED")

            async def captured() -> bool:  # the server publishes an advisory after its API reply: not stored yet
                found = await find_captured(conn, "ADVISORIES", start_time=since, advisory_filter=created)
                return found["advisory"] is not None

            await async_wait_until(captured, "the capture stream to store GATED's stream_created advisory")
            watch = watch_advisories(conn, created, capture_stream="ADVISORIES", start_time=since, fetch_timeout=1)
            try:
                return await held_at_the_gate(conn, "ADVISORIES", anext(watch))
            finally:
                await watch.aclose()

    fired_while_held, advisory = asyncio.run(scenario())
    assert not fired_while_held
    assert (advisory.kind, advisory.stream) == ("stream_created", "GATED")


def test_a_capture_stream_made_without_direct_gets_is_moved_to_them_keeping_its_subjects(settings):
    """A capture stream made by hand (here $JS.EVENT.ADVISORY.>, no allow_direct) gets allow_direct on the next
    ensure and keeps the subjects it has; one that asks for subjects gets them."""

    async def scenario():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "OLD_DEFAULT", "subjects": ["$JS.EVENT.ADVISORY.>"], "max_age": "1h"})
            moved = await ensure_capture_stream(conn, "OLD_DEFAULT")
            again = await ensure_capture_stream(conn, "OLD_DEFAULT")
            old = (await conn.api_request("STREAM.INFO.OLD_DEFAULT"))["config"]
            await conn.api_request("STREAM.DELETE.OLD_DEFAULT")
            await ensure_stream(conn, {"name": "CHOSEN", "subjects": ["$JS.EVENT.ADVISORY.>"], "max_age": "1h"})
            kept = await ensure_capture_stream(conn, "CHOSEN", subjects=["$JS.EVENT.ADVISORY.>"])
            chosen = (await conn.api_request("STREAM.INFO.CHOSEN"))["config"]
            return moved, again, old, kept, chosen

    moved, again, old, kept, chosen = asyncio.run(scenario())
    assert moved["action"] == "updated" and moved["changed"] == ["allow_direct"]
    assert old["subjects"] == ["$JS.EVENT.ADVISORY.>"] and old["allow_direct"] is True
    assert again["action"] == "unchanged"
    assert kept["changed"] == ["allow_direct"] and chosen["subjects"] == ["$JS.EVENT.ADVISORY.>"]


def test_reader_reports_missing_capture_stream(settings):
    async def scenario():
        async with open_connection(settings) as conn:
            await find_captured(conn, "ADVISORIES", start_time=datetime.now(UTC), advisory_filter=AdvisoryFilter())

    with pytest.raises(StreamNotFoundError) as err:
        asyncio.run(scenario())
    assert "JetStreamAdvisoryStreamOperator" in err.value.message and "capture_stream=None" in err.value.message


def test_reader_refuses_subject_outside_the_capture_stream(settings):
    async def scenario():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, capture_stream_config("ADVISORIES", subjects=["$JS.EVENT.ADVISORY.STREAM.>"]))
            await find_captured(conn, "ADVISORIES", start_time=datetime.now(UTC),
                                advisory_filter=AdvisoryFilter(advisory="max_deliveries"))

    with pytest.raises(InvalidRequestError) as err:
        asyncio.run(scenario())
    assert err.value.reason == "subject_not_captured"


def test_real_batch_abandoned_and_max_deliveries_are_captured(nats_server_factory):
    server = nats_server_factory(jetstream={"limits": {"batch": {"timeout": "1s"}}})
    from airflow_jetstream.client import ConnectionSettings

    settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3)

    async def scenario():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, capture_stream_config("ADVISORIES", max_age="1h"))
            since = datetime.now(UTC)
            await ensure_stream(conn, {"name": "ATOM", "subjects": ["atom.>"], "allow_atomic": True})
            await conn.nc.request("atom.1", b"x", headers={"Nats-Batch-Id": "run-42", "Nats-Batch-Sequence": "1"})
            await conn.js.publish("atom.2", b"y")
            await conn.api_request("CONSUMER.CREATE.ATOM.C", {"stream_name": "ATOM", "config": {
                "durable_name": "C", "ack_policy": "explicit", "max_deliver": 1, "ack_wait": 200_000_000}})
            sub = await conn.js.pull_subscribe_bind(consumer="C", stream="ATOM")
            await sub.fetch(1)  # never acked: max_deliver 1 is hit after ack_wait
            abandoned = watch_advisories(conn, AdvisoryFilter(advisory="batch_abandoned", stream="ATOM"),
                                         capture_stream="ADVISORIES", start_time=since, fetch_timeout=1)
            first = await asyncio.wait_for(anext(abandoned), 20)
            await abandoned.aclose()
            poison = watch_advisories(conn, AdvisoryFilter(advisory="max_deliveries", stream="ATOM", consumer="C"),
                                      capture_stream="ADVISORIES", start_time=since, fetch_timeout=1)
            second = await asyncio.wait_for(anext(poison), 20)
            await poison.aclose()
            return first, second

    first, second = asyncio.run(scenario())
    assert first.kind == "batch_abandoned" and first.batch == "run-42" and first.reason == "timeout"
    # the abandoned batch stored nothing, so the plain message is seq 1
    assert second.kind == "max_deliveries" and second.stream_seq == 1 and second.consumer == "C"


def test_live_listen_sees_only_what_is_published_while_listening(settings):
    async def scenario():
        async with open_connection(settings) as conn:
            # nats-server publishes a stream's advisory after its API reply: wait until EARLY's is out
            early = await conn.nc.subscribe("$JS.EVENT.ADVISORY.STREAM.CREATED.EARLY", max_msgs=1)
            await ensure_stream(conn, {"name": "EARLY", "subjects": ["early.>"]})
            await early.next_msg(timeout=30)
            listener = asyncio.ensure_future(listen_live(conn, AdvisoryFilter(advisory="stream_created"), 10))
            attempt = 0
            while not listener.done():  # the subscription starts at some point: keep creating streams until seen
                attempt += 1
                await ensure_stream(conn, {"name": f"LIVE{attempt}", "subjects": [f"live{attempt}.>"]})
                await asyncio.wait({listener}, timeout=0.2)
            missed = await listen_live(conn, AdvisoryFilter(advisory="stream_deleted"), 0.2)
            return listener.result(), missed

    live, missed = asyncio.run(scenario())
    assert live is not None and live.stream.startswith("LIVE")
    assert missed is None

"""ui/problems.py without a server: each rule's threshold and since, and the order (worst, then oldest); the
view's size format."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow_jetstream.ui.pages import PageQuery, shape, size
from airflow_jetstream.ui.problems import Observations, Thresholds, find_problems

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _iso(minutes_ago: float) -> str:
    return (NOW - timedelta(minutes=minutes_ago)).isoformat()


def _consumer(name: str, **fields) -> dict:
    row = {"stream": "S", "name": name, "durable": True, "pull": True, "filter_subjects": [], "ack_policy": "explicit",
           "ack_wait_ns": 30_000_000_000, "max_deliver": -1, "num_pending": 0, "num_ack_pending": 0,
           "num_redelivered": 0, "num_waiting": 0, "last_active": _iso(0), "last_ack": _iso(0), "created": _iso(60),
           "paused": False, "pause_until": None}
    return {**row, **fields}


def _stream(name: str, **fields) -> dict:
    return {"name": name, "num_replicas": 1, "leader": None, "replicas": [], **fields}


def _kinds(snapshot: dict, limits: Thresholds | None = None, seen: Observations | None = None) -> list[tuple]:
    found = find_problems(snapshot, limits or Thresholds(), seen or Observations(), NOW)
    return [(p["kind"], p["anchor"]) for p in found]


def test_consumer_rules_follow_their_thresholds() -> None:
    consumers = [
        _consumer("fine", num_pending=10, num_waiting=1),
        _consumer("redelivers", num_redelivered=3),
        _consumer("overdue", num_ack_pending=5, last_ack=_iso(2)),  # ack_wait 30 s
        _consumer("in_time", num_ack_pending=5, last_ack=_iso(0.2)),
        _consumer("idle", num_pending=7, last_active=_iso(10)),
        _consumer("recently_pulled", num_pending=7, last_active=_iso(1)),
        _consumer("push", num_pending=7, last_active=_iso(10), pull=False),
        _consumer("paused", paused=True, pause_until=_iso(-60), num_pending=7, last_active=_iso(10)),
    ]
    found = _kinds({"consumers": {"consumers": consumers}}, Thresholds(pending_idle=300, redelivered=2))
    assert sorted(found) == sorted([
        ("consumer_redelivering", "consumer-S-redelivers"), ("ack_overdue", "consumer-S-overdue"),
        ("consumer_idle", "consumer-S-idle"), ("consumer_paused", "consumer-S-paused")])
    assert _kinds({"consumers": {"consumers": [_consumer("r", num_redelivered=1)]}}, Thresholds(redelivered=2)) == []


def test_since_is_the_servers_time_where_it_has_one_else_the_first_time_seen() -> None:
    seen = Observations()
    snapshot = {"consumers": {"consumers": [_consumer("idle", num_pending=7, last_active=_iso(10)),
                                            _consumer("redelivers", num_redelivered=3)]}}
    first = {p["kind"]: p for p in find_problems(snapshot, Thresholds(), seen, NOW)}
    assert first["consumer_idle"]["since"] == _iso(10) and first["consumer_idle"]["since_means"] == "last delivery"
    assert first["consumer_redelivering"]["since"] == NOW.isoformat()
    assert first["consumer_redelivering"]["since_means"] == "first seen by this view"
    later = {p["kind"]: p for p in find_problems(snapshot, Thresholds(), seen, NOW + timedelta(minutes=5))}
    assert later["consumer_redelivering"]["since"] == NOW.isoformat(), "remembered, not reset"
    find_problems({"consumers": {"consumers": []}}, Thresholds(), seen, NOW)
    assert seen.first_seen == {}, "a problem that went away is forgotten"


def test_a_source_backlog_that_does_not_shrink_is_flagged_after_the_threshold() -> None:
    def source(backlog: int, active_s: float = 0.5) -> dict:
        return {"sources": {"sources": [{"stream": "AGG", "source": "O", "mirror": False, "lag": backlog,
                                         "active": int(active_s * 1e9), "active_s": active_s, "error": None,
                                         "consumer_num_pending": 0}]}}

    seen, limits = Observations(), Thresholds(source_stalled=60)
    at = [NOW + timedelta(seconds=s) for s in (0, 30, 61, 90, 200)]
    assert find_problems(source(100), limits, seen, at[0]) == []
    assert find_problems(source(100), limits, seen, at[1]) == []
    [stalled] = find_problems(source(120), limits, seen, at[2])  # grew: still not shrinking since at[0]
    assert stalled["kind"] == "source_stalled" and stalled["since"] == at[0].isoformat()
    assert find_problems(source(80), limits, seen, at[3]) == []  # shrank
    [idle] = find_problems(source(80, active_s=120), limits, Observations(), at[4])
    assert idle["since_means"] == "last activity"
    broken = source(0)
    broken["sources"]["sources"][0]["error"] = {"reason": "consumer_not_flow_control", "message": "not flow control"}
    [error] = find_problems(broken, limits, Observations(), at[4])
    assert (error["kind"], error["severity"]) == ("source_error", "error") and "not flow control" in error["why"]


def test_streams_replicas_and_listing_gaps() -> None:
    streams = [
        _stream("R1"),
        _stream("NOLEADER", num_replicas=3),
        _stream("DOWN", num_replicas=3, leader="n1",
                replicas=[{"name": "n2", "current": False, "offline": True, "lag": 0},
                          {"name": "n3", "current": False, "offline": False, "lag": 42}]),
    ]
    found = _kinds({"streams": {"streams": streams, "total": 4, "read": 3, "missing": ["GONE"]}})
    assert ("stream_no_leader", "stream-NOLEADER") in found and ("replica_offline", "stream-DOWN") in found
    assert ("replica_lagging", "stream-DOWN") in found and ("stream_no_leader", "section-streams") in found
    assert ("read_incomplete", "section-streams") in found and not any(a == "stream-R1" for _, a in found)


def test_advisories_are_problems_while_younger_than_the_window() -> None:
    rows = [{"capture_seq": 9, "kind": "batch_abandoned", "stream": "S", "batch": "b-1", "reason": "timeout",
             "timestamp": _iso(30)},
            {"capture_seq": 5, "kind": "max_deliveries", "stream": "S", "consumer": "c", "stream_seq": 3,
             "deliveries": 5, "timestamp": _iso(60 * 25)},
            {"capture_seq": 4, "kind": "consumer_created", "stream": "S", "consumer": "c", "timestamp": _iso(1)},
            {"capture_seq": 3, "kind": "msg_terminated", "stream": "S", "consumer": "c", "stream_seq": 2,
             "reason": "bad payload", "timestamp": _iso(2)}]
    found = find_problems({"advisories": {"advisories": rows, "capture": _capture()}}, Thresholds(advisory_age=86400),
                          Observations(), NOW)
    assert [(p["kind"], p["severity"], p["object"].get("batch")) for p in found] == [
        ("batch_abandoned", "error", "b-1"), ("msg_terminated", "warning", None)]
    assert "(bad payload)" in found[1]["why"] and found[1]["anchor"] == "advisory-3"


def test_advisories_of_one_kind_about_one_object_are_one_problem_with_a_count() -> None:
    given_up = [{"capture_seq": 20 - i, "kind": "max_deliveries", "stream": "S", "consumer": "c", "stream_seq": 9 - i,
                 "deliveries": 3, "timestamp": _iso(i)} for i in range(5)]  # newest first, as the window reads
    other = {"capture_seq": 14, "kind": "max_deliveries", "stream": "S", "consumer": "d", "stream_seq": 1,
             "deliveries": 3, "timestamp": _iso(6)}
    abandoned = [{"capture_seq": 13 - i, "kind": "batch_abandoned", "stream": "S", "batch": f"b-{i}",
                  "reason": "timeout", "timestamp": _iso(7 + i)} for i in range(3)]
    found = find_problems({"advisories": {"advisories": [*given_up, other, *abandoned], "capture": _capture()}},
                          Thresholds(), Observations(), NOW)
    by = {(p["kind"], p["object"].get("consumer")): p for p in found}
    assert sorted(by) == [("batch_abandoned", None), ("max_deliveries", "c"), ("max_deliveries", "d")]
    five = by["max_deliveries", "c"]
    assert (five["count"], five["since"], five["newest"], five["anchor"]) == (5, _iso(4), _iso(0), "advisory-20")
    assert "gave up on 5 messages (stream seq 9, 8, 7, 6, 5)" in five["why"]
    assert by["max_deliveries", "d"]["count"] == 1 and by["batch_abandoned", None]["count"] == 3
    assert "abandoned 3 atomic batches on stream 'S' ('b-0', 'b-1', 'b-2'" in by["batch_abandoned", None]["why"]


def _capture(**fields) -> dict:
    return {"captures_api_audits": False, "allow_direct": True, "direct_reads": True, **fields}


def test_a_capture_stream_that_reading_writes_into_is_flagged() -> None:
    def kinds(**facts) -> list[str]:
        snapshot = {"capture_stream": "ADV", "advisories": {"advisories": [], "capture": _capture(**facts)}}
        return [p["kind"] for p in find_problems(snapshot, Thresholds(), Observations(), NOW)]

    assert kinds() == []
    assert kinds(captures_api_audits=True) == ["capture_writes_on_read"]
    assert kinds(allow_direct=False, direct_reads=False) == ["capture_writes_on_read"]
    missing = {"capture_stream": "ADV", "advisories": {"error": {"reason": "stream_not_found", "message": "no"}}}
    assert [p["kind"] for p in find_problems(missing, Thresholds(), Observations(), NOW)] == ["capture_missing"]


def test_worst_first_then_oldest_and_rows_sorted_by_their_worst_problem() -> None:
    snapshot = {
        "streams": {"streams": [_stream("A"), _stream("B", num_replicas=3), _stream("C")], "total": 3, "read": 3},
        "consumers": {"consumers": [_consumer("quiet"), _consumer("late", num_redelivered=2),
                                    _consumer("idle", num_pending=5, last_active=_iso(30))], "total": 3, "read": 3},
        "ledger": {"bucket": "L", "runs": [{"run_id": "r1", "failed_count": 1, "overdue_count": 0, "streams": ["A"],
                                            "failed": [{"batch_id": "b", "failed_at": _iso(5), "last_error": "x"}],
                                            "overdue": []}]},
    }
    problems = find_problems(snapshot, Thresholds(), Observations(), NOW)
    assert [p["severity"] for p in problems] == ["error", "error", "warning", "warning"]
    errors = [p for p in problems if p["severity"] == "error"]
    assert [p["kind"] for p in errors] == ["ledger_failed", "stream_no_leader"]  # 5 min ago, then first seen now
    view = shape({**snapshot, "problems": problems}, PageQuery(per_page=2))
    assert [row["name"] for row in view["streams"]["streams"]] == ["B", "A"]
    assert [row["problem"] for row in view["consumers"]["consumers"]] == ["warning", "warning"]
    assert view["consumers"]["total"] == 3 and view["consumers"]["pages"] == 2
    assert view["other_streams"] == ["C"]
    located = {p["anchor"]: p["at"] for p in view["problems"]["problems"]}
    assert located["stream-B"] == {"section": "streams", "page": 1}


def test_the_views_ledger_rows_are_the_ledgers_own_run_summary() -> None:
    """Issue 41: one run summary. A run's row counts what the ledger's summary counts (states, batches, messages,
    attempts, streams, expired claims) and adds only what the view shows beside it."""
    from airflow_jetstream.client.ledger.counts import summarized
    from airflow_jetstream.client.ledger.records import BatchRecord
    from airflow_jetstream.ui.overview import run_rows

    now = NOW.timestamp()
    records = [
        BatchRecord("r1", "b1", "A", 10, state="consumed", attempts=1, created_at=_iso(30), updated_at=_iso(20)),
        BatchRecord("r1", "b2", "B", 5, state="failed", attempts=3, created_at=_iso(40), updated_at=_iso(10),
                    failed_at=_iso(10), last_error="boom"),
        BatchRecord("r1", "b3", "A", 7, state="in_progress", attempts=2, owner="w1", deadline=_iso(1),
                    created_at=_iso(35), updated_at=_iso(5)),
        BatchRecord("r2", "c1", "A", 1, created_at=_iso(50), updated_at=_iso(50)),
    ]
    rows = run_rows(records, bucket="L", now=now)
    assert [row["run_id"] for row in rows] == ["r1", "r2"]  # newest update first
    summary = summarized("r1", "L", records[:3], now)
    row = rows[0]
    for name in ("batches", "states", "attempts", "streams", "expired_claims", "next_deadline"):
        assert row[name] == summary[name], name
    assert row["messages"] == sum(summary["messages"].values()) == 22
    assert (row["failed_count"], row["overdue_count"], row["max_attempts"]) == (1, 1, 3)
    assert (row["created_at"], row["updated_at"]) == (_iso(40), _iso(5))
    assert row["failed"] == [{"batch_id": "b2", "attempts": 3, "last_error": "boom", "failed_at": _iso(10)}]
    assert row["overdue"] == [{"batch_id": "b3", "owner": "w1", "deadline": _iso(1), "attempts": 2}]
    assert [p["kind"] for p in find_problems({"ledger": {"bucket": "L", "runs": rows}}, Thresholds(), Observations(),
                                             NOW)] == ["ledger_failed", "ledger_overdue"]


def test_sizes_read_in_short_binary_units_small_ones_too():
    assert [size(n) for n in (0, 1, 512, 1023)] == ["0 B", "1 B", "512 B", "1023 B"]
    assert [size(n) for n in (1024, 1536, 2**20, 3 * 2**30, 2**40, 2**50, 7 * 2**60)] == [
        "1.0 KiB", "1.5 KiB", "1.0 MiB", "3.0 GiB", "1.0 TiB", "1.0 PiB", "7.0 EiB"]

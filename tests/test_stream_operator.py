"""JetStreamEnsureStreamOperator against a real nats-server."""

from __future__ import annotations

import json

import pytest

from airflow_jetstream.client.admin.streams import find_stream
from airflow_jetstream.client.errors import StreamConfigError
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator

CONFIG = {
    "name": "ORDERS",
    "subjects": ["orders.>"],
    "retention": "workqueue",
    "storage": "file",
    "num_replicas": 1,
    "max_age": "7d",
    "max_bytes": 10_000_000,
    "max_msgs": 100_000,
    "duplicate_window": "2m",
    "allow_atomic": True,
    "allow_batched": True,
    "allow_direct": True,
}


def _run(config, **kwargs):
    return JetStreamEnsureStreamOperator(task_id="ensure", config=config, **kwargs).execute(context={})


def test_create_then_noop_then_update(nats_conn, capsys):
    first = _run(CONFIG)
    assert first["action"] == "created"
    assert first["config"]["retention"] == "workqueue"
    assert first["config"]["max_age"] == 7 * 86400 * 10**9
    assert first["config"]["allow_atomic"] is True and first["config"]["allow_batched"] is True
    json.dumps(first)

    capsys.readouterr()
    second = _run(CONFIG)
    assert second["action"] == "unchanged"
    logged = capsys.readouterr().out
    assert "already matches" in logged and "nothing to do" in logged

    third = _run({**CONFIG, "max_msgs": 5})
    assert third["action"] == "updated"
    assert third["changed"] == ["max_msgs"]
    assert third["config"]["max_msgs"] == 5


def test_update_keeps_fields_not_mentioned(nats_conn):
    _run(CONFIG)
    result = _run({"name": "ORDERS", "description": "orders from the shop"})
    assert result["action"] == "updated"
    assert result["config"]["allow_atomic"] is True
    # ensure_stream gave the atomic stream its fence namespace
    assert result["config"]["subjects"] == ["orders.>", "_FENCE.ORDERS.>"]


@pytest.mark.parametrize(
    ("change", "field"),
    [({"storage": "memory"}, "storage"), ({"retention": "limits"}, "retention")],
)
def test_immutable_change_names_the_field(nats_conn, change, field):
    _run(CONFIG)
    with pytest.raises(StreamConfigError) as info:
        _run({**CONFIG, **change})
    assert field in str(info.value)
    assert JetStreamHook().run(find_stream, "ORDERS")["config"][field] == CONFIG[field]


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({**CONFIG, "replicas": 3}, "unknown stream config field(s) replicas"),
        ({**CONFIG, "retention": "forever"}, "retention='forever' is not valid"),
        ({**CONFIG, "subjects": ["orders..new"]}, "empty token"),
        ({**CONFIG, "name": "bad.name"}, "stream name"),
        ({**CONFIG, "max_age": "a week"}, "cannot read duration"),
        ({"subjects": ["x"]}, "needs a 'name'"),
    ],
)
def test_bad_config_is_rejected_before_any_call(nats_conn, nats_server, config, fragment):
    with pytest.raises(StreamConfigError) as info:
        _run(config)
    assert fragment in str(info.value)
    assert nats_server.monitor("jsz")["streams"] == 0
    assert nats_server.monitor("varz")["in_msgs"] == 0


def test_config_is_templated(nats_conn):
    op = JetStreamEnsureStreamOperator(
        task_id="t", config={"name": "{{ params.stream }}", "subjects": ["{{ params.stream | lower }}.>"]}
    )
    op.render_template_fields(context={"params": {"stream": "EVENTS"}})
    assert op.config == {"name": "EVENTS", "subjects": ["events.>"]}
    assert op.execute(context={})["action"] == "created"


def test_overlapping_subjects_is_a_clear_error(nats_conn):
    _run(CONFIG)
    with pytest.raises(StreamConfigError) as info:
        _run({"name": "OTHER", "subjects": ["orders.new", "other.x"]})
    assert info.value.reason == "subjects_overlap"
    assert "'orders.new' overlaps stream(s) 'ORDERS'" in str(info.value), "names the stream that captures it"
    assert "other.x" not in str(info.value)
    _run({"name": "OTHER", "subjects": ["other.x"]})
    with pytest.raises(StreamConfigError) as update:
        _run({"name": "OTHER", "subjects": ["other.x", "orders.>"]})
    assert update.value.reason == "subjects_overlap" and "'orders.>' overlaps stream(s) 'ORDERS'" in str(update.value)

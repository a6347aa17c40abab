"""KV on a real server: the operator (bucket ensured; put/create/update by revision/delete), the sensor
(poke and deferrable, KV watch), the trigger sharing connections, key assets, typed bad input."""

from __future__ import annotations

import asyncio
import base64

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_jetstream.assets.jetstream import InvalidAssetURIError, kv_asset, parse_asset_uri
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import (
    BucketNotFoundError,
    InvalidKeyError,
    InvalidRequestError,
    KeyRevisionError,
    PlacementError,
    StreamNotFoundError,
)
from airflow_jetstream.client.kv import ensure_bucket, get_key
from airflow_jetstream.client.kv.keys import check_key, create_key, put_key, wait_for_key
from airflow_jetstream.client.kv.names import KeyCondition, stream_of
from airflow_jetstream.client.reading.shared_tail import tail_stats
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.embedded.cluster import CLUSTER_NAME
from airflow_jetstream.operators.kv import JetStreamKeyValueOperator
from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger
from tests.support.catch_up_gate import held_at_the_gate
from tests.support.nats_calls import call_on_server
from tests.support.polling import async_wait_until
from tests.support.servers import default_conn_id, module_server


def version_at_least(entry: dict, minimum: int) -> bool:
    """Module-level predicate for the sensor (importable by dotted path)."""
    return entry.get("json", {}).get("version", 0) >= minimum


server = module_server("kv")
conn_id = default_conn_id()


def _call(server: EmbeddedNatsServer, func, *args, **kwargs):
    return call_on_server(ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3),
                          func, *args, **kwargs)


def _op(**kwargs) -> JetStreamKeyValueOperator:
    return JetStreamKeyValueOperator(task_id="kv", bucket="KV_MODELS", key="churn.latest", **kwargs)


def test_operator_ensures_the_bucket_and_writes_by_the_rules(conn_id, server) -> None:
    config = {"history": 5, "ttl": "7d", "num_replicas": 1}
    put = _op(value={"version": 41}, bucket_config=config)
    first = put.execute({})
    assert (first["bucket_action"], first["operation"], first["revision"]) == ("created", "put", 1)
    assert put.outlets[0].uri == f"jetstream://{server.url.split('://')[1]}/KV_KV_MODELS/%24KV.KV_MODELS.churn.latest"
    assert _op(value={"version": 41}, bucket_config=config).execute({})["bucket_action"] == "unchanged"

    with pytest.raises(KeyRevisionError, match="already exists") as exists:
        _op(value="x", operation="create", bucket_config=None).execute({})
    assert exists.value.reason == "key_exists"
    updated = _op(value={"version": 42}, operation="update", revision="2").execute({})
    assert (updated["revision"], updated["previous_revision"]) == (3, 2)
    with pytest.raises(KeyRevisionError, match="at revision 3, not 2") as stale:
        _op(value={"version": 43}, operation="update", revision=2).execute({})
    assert stale.value.reason == "wrong_revision"
    assert _call(server, get_key, "KV_MODELS", "churn.latest")["json"] == {"version": 42}

    with pytest.raises(KeyRevisionError):
        _op(operation="delete", revision=1).execute({})
    _op(operation="delete", revision=3).execute({})
    assert _call(server, get_key, "KV_MODELS", "churn.latest") is None
    assert _op(value="back", operation="create").execute({})["operation"] == "create"  # a deleted key may be created
    bigger = _op(value="v", bucket_config={"history": 10}).execute({})
    assert bigger["bucket_action"] == "updated"


async def _key_history(conn, bucket: str, key: str) -> tuple[int, dict]:
    """How many messages the bucket's stream holds for ``key``, and the headers of the last one."""
    info = await conn.api_request(f"STREAM.INFO.KV_{bucket}", {"subjects_filter": f"$KV.{bucket}.{key}"})
    last = await conn.api_request(f"STREAM.MSG.GET.KV_{bucket}", {"last_by_subj": f"$KV.{bucket}.{key}"})
    headers = base64.b64decode(last["message"].get("hdrs") or b"").decode()
    return int((info["state"].get("subjects") or {}).get(f"$KV.{bucket}.{key}", 0)), headers


def test_purge_drops_the_keys_history_and_leaves_one_marker(conn_id, server) -> None:
    """``purge`` (docs/operators/kv.md): a delete marker that also drops the key's history (``Nats-Rollup: sub``);
    the key then reads as missing, and the other keys keep theirs."""
    purged = dict(task_id="kv", bucket="KV_PURGE", key="model.v")
    for value in ("a", "b", "c"):
        JetStreamKeyValueOperator(value=value, bucket_config={"history": 10}, **purged).execute({})
    JetStreamKeyValueOperator(value="kept", bucket_config={"history": 10}, task_id="kv2", bucket="KV_PURGE",
                              key="model.w").execute({})
    assert _call(server, _key_history, "KV_PURGE", "model.v")[0] == 3
    result = JetStreamKeyValueOperator(operation="purge", bucket_config=None, **purged).execute({})
    assert (result["operation"], result["key"]) == ("purge", "model.v")
    count, headers = _call(server, _key_history, "KV_PURGE", "model.v")
    assert count == 1 and "KV-Operation: PURGE" in headers, (count, headers)
    assert _call(server, get_key, "KV_PURGE", "model.v") is None
    assert _call(server, get_key, "KV_PURGE", "model.w")["value"] == "kept"


def test_sensor_pokes_until_exists_equals_or_satisfies(conn_id, server) -> None:
    _op(value="warming", bucket_config={}).execute({})
    status = dict(task_id="s", bucket="KV_MODELS", key="churn.status", deferrable=False)
    assert not JetStreamKeyValueSensor(**status).poke({}).is_done
    _call(server, put_key, "KV_MODELS", "churn.status", "warming")
    exists = JetStreamKeyValueSensor(**status).poke({})
    assert exists.is_done and exists.xcom_value["value"] == "warming"
    assert not JetStreamKeyValueSensor(value="ready", **status).poke({}).is_done
    _call(server, put_key, "KV_MODELS", "churn.status", "ready")
    assert JetStreamKeyValueSensor(value="ready", **status).poke({}).xcom_value["revision"] > 1
    _call(server, put_key, "KV_MODELS", "churn.meta", {"version": 7})
    meta = dict(task_id="m", bucket="KV_MODELS", key="churn.meta", deferrable=False)
    assert JetStreamKeyValueSensor(value={"version": 7}, **meta).poke({}).is_done
    below = JetStreamKeyValueSensor(apply_function=version_at_least, apply_function_args=[8], **meta)
    assert not below.poke({}).is_done


def test_deferrable_sensor_watches_the_key(conn_id, server) -> None:
    _op(value="v", bucket_config={}).execute({})
    _call(server, put_key, "KV_MODELS", "churn.model", {"version": 1})
    sensor = JetStreamKeyValueSensor(task_id="w", bucket="KV_MODELS", key="churn.model",
                                     apply_function="tests.test_kv.version_at_least",
                                     apply_function_kwargs={"minimum": 3}, deferrable=True, timeout=30)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    _, kwargs = deferred.value.trigger.serialize()
    trigger = JetStreamKeyValueTrigger(**kwargs)

    async def scenario() -> dict:
        run = asyncio.ensure_future(anext(trigger.run()))
        settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3)
        async with open_connection(settings) as conn:
            for version in (2, 3):
                await put_key(conn, "KV_MODELS", "churn.model", {"version": version})
        return (await asyncio.wait_for(run, 20)).payload

    event = asyncio.run(scenario())
    assert event["status"] == "matched" and event["entry"]["json"] == {"version": 3}
    assert sensor.execute_complete({}, event)["key"] == "churn.model"


def test_missing_bucket_and_bad_input_are_typed_errors(conn_id, server) -> None:
    with pytest.raises(BucketNotFoundError, match="create it first"):
        JetStreamKeyValueOperator(task_id="k", bucket="KV_NONE", key="a", value="b").execute({})
    event = asyncio.run(asyncio.wait_for(anext(JetStreamKeyValueTrigger(bucket="KV_NONE", key="a").run()), 20))
    assert event.payload["error"]["reason"] == "bucket_not_found"
    with pytest.raises(InvalidKeyError):
        JetStreamKeyValueOperator(task_id="k", bucket="KV_MODELS", key="a b", value="b")
    with pytest.raises(InvalidKeyError, match="letters, digits"):
        JetStreamKeyValueSensor(task_id="k", bucket="bad.bucket", key="a")
    with pytest.raises(InvalidRequestError, match="not both"):
        JetStreamKeyValueSensor(task_id="k", bucket="KV_MODELS", key="a", value="x", apply_function=version_at_least)
    with pytest.raises(InvalidRequestError, match="needs revision"):
        JetStreamKeyValueOperator(task_id="k", bucket="KV_MODELS", key="a", value="b", operation="update")
    with pytest.raises(InvalidRequestError, match="operation must be one of"):
        JetStreamKeyValueOperator(task_id="k", bucket="KV_MODELS", key="a", value="b", operation="upsert")
    with pytest.raises(InvalidRequestError, match="bucket_config takes"):
        JetStreamKeyValueOperator(task_id="k", bucket="KV_MODELS", key="a", value="b", bucket_config={"ttl_s": 1})


def test_a_key_the_server_marked_removed_does_not_exist_for_a_look_or_a_watch(conn_id, server) -> None:
    """A key whose last message is a server's marker (``Nats-Marker-Reason``, as nats-server 2.11+ writes when a
    key expires by TTL or max age) does not exist: the sensor's poke and its trigger's watch read it alike, and
    the operator's create writes it again."""
    _op(value="v", bucket_config={}).execute({})
    condition = KeyCondition()

    async def scenario() -> tuple:
        settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3)
        async with open_connection(settings) as conn:
            await put_key(conn, "KV_MODELS", "churn.expiring", "old")
            await conn.js.publish("$KV.KV_MODELS.churn.expiring", b"", headers={"Nats-Marker-Reason": "MaxAge"})
            looked = await get_key(conn, "KV_MODELS", "churn.expiring"), await check_key(
                conn, "KV_MODELS", "churn.expiring", condition)
            watch = asyncio.ensure_future(wait_for_key(conn, "KV_MODELS", "churn.expiring", condition))
            await async_wait_until(lambda: watch.done() or any(t.listeners for t in tail_stats(conn)),
                                   "the watch following the bucket")
            revision = (await put_key(conn, "KV_MODELS", "churn.expiring", "new"))["revision"]
            watched = await asyncio.wait_for(watch, 20)
            await conn.js.publish("$KV.KV_MODELS.churn.expiring", b"", headers={"Nats-Marker-Reason": "MaxAge"})
            created = await create_key(conn, "KV_MODELS", "churn.expiring", "again")  # it does not exist
            with pytest.raises(KeyRevisionError, match="already exists"):
                await create_key(conn, "KV_MODELS", "churn.expiring", "twice")
            return looked, revision, watched, created, await get_key(conn, "KV_MODELS", "churn.expiring")

    looked, revision, watched, created, now = asyncio.run(scenario())
    assert looked == (None, None)
    assert (watched["revision"], watched["value"]) == (revision, "new")
    assert (now["revision"], now["value"]) == (created["revision"], "again")


def test_a_watch_reads_the_current_value_only_when_its_turn_to_catch_up_comes(conn_id, server) -> None:
    """A watch reads the key's current value (stored before it joined the bucket's shared tail) inside
    ``listener.catching_up()``: a thousand deferred sensors starting together read theirs CATCH_UP_AT_ONCE at a
    time. A key that already holds fires only once a turn is free."""
    _op(value="v", bucket_config={}).execute({})

    async def scenario() -> tuple:
        settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3)
        async with open_connection(settings) as conn:
            written = await put_key(conn, "KV_MODELS", "churn.gated", "ready")
            watch = wait_for_key(conn, "KV_MODELS", "churn.gated", KeyCondition(value="ready"))
            return written, *await held_at_the_gate(conn, stream_of("KV_MODELS"), watch)

    written, fired_while_held, entry = asyncio.run(scenario())
    assert not fired_while_held
    assert (entry["revision"], entry["value"]) == (written["revision"], "ready")


def test_kv_key_assets_are_jetstream_assets() -> None:
    asset = kv_asset("nats.example.com", "models", "churn.latest")
    assert asset.uri == "jetstream://nats.example.com:4222/KV_models/%24KV.models.churn.latest"
    ref = parse_asset_uri(asset.uri)
    assert (ref.stream, ref.subject) == ("KV_models", "$KV.models.churn.latest")
    assert kv_asset("nats.example.com", "models").uri == "jetstream://nats.example.com:4222/KV_models"
    with pytest.raises(InvalidAssetURIError):
        kv_asset("nats.example.com", "models", "bad key")


def test_on_a_cluster_a_new_bucket_is_replicated_and_the_watch_sees_the_key(monkeypatch, nats_cluster) -> None:
    from tests.conftest import set_nats_cluster_connection

    set_nats_cluster_connection(monkeypatch, "nats_default", nats_cluster)
    written = JetStreamKeyValueOperator(task_id="kv", bucket="KV_cluster", key="model.status", value="ready",
                                        bucket_config={}).execute({})
    assert written["bucket_action"] == "created"

    async def replicas() -> int:
        settings = ConnectionSettings(servers=nats_cluster.servers, connect_timeout=2, request_timeout=5)
        async with open_connection(settings) as conn:
            return (await conn.js.stream_info("KV_KV_cluster")).config.num_replicas
    assert asyncio.run(replicas()) == 3, "a bucket created unasked on a cluster is R3"

    placed = {"num_replicas": 3, "placement": {"cluster": CLUSTER_NAME}}
    JetStreamKeyValueOperator(task_id="kv", bucket="KV_placed", key="k", value="v", bucket_config=placed).execute({})
    with pytest.raises(PlacementError) as impossible:
        JetStreamKeyValueOperator(task_id="kv", bucket="KV_nowhere", key="k", value="v",
                                  bucket_config={"placement": {"cluster": "no-such-cluster"}}).execute({})
    assert impossible.value.reason == "placement_failed"

    async def placements() -> dict:
        settings = ConnectionSettings(servers=nats_cluster.servers, connect_timeout=2, request_timeout=5)
        async with open_connection(settings) as conn:
            with pytest.raises(StreamNotFoundError):  # an impossible placement creates nothing
                await stream_info(conn, "KV_KV_nowhere")
            return await ensure_bucket(conn, "KV_placed", **placed)
    again = asyncio.run(placements())
    assert (again["action"], again["num_replicas"], again["placement"]) == ("unchanged", 3, {"cluster": CLUSTER_NAME})
    trigger = JetStreamKeyValueTrigger(bucket="KV_cluster", key="model.status", value="ready")
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 30)).payload
    assert event["status"] == "matched" and event["entry"]["value"] == "ready"

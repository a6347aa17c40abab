"""Feature detection against the real server: what the connected nats-server lacks is refused before
anything is sent, with a typed error naming the release it needs.

Every test branches on what the server *reports* (``server_features.supports``), never on a version list:
`make compat` runs this file against nats-server 2.11, 2.12, 2.14 and 2.15, so both branches run for real.
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from nats.aio.client import ServerVersion

from airflow_jetstream.client import server_features
from airflow_jetstream.client.admin.streams import ensure_stream, find_stream, stream_info
from airflow_jetstream.client.batches.atomic import publish_atomic_batch
from airflow_jetstream.client.batches.batcher import Batcher
from airflow_jetstream.client.batches.fast import publish_fast_batch
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.errors import JetStreamError, ServerFeatureError
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.support.nats_calls import with_streams

pytestmark = pytest.mark.compat

PLAIN = {"name": "PLAIN", "subjects": ["plain.>"]}
MESSAGES = [BatchMessage("plain.x", b"m%d" % i, msg_id=f"id-{i}") for i in range(3)]


def _stored(info: dict) -> int:
    return info["state"]["messages"]


def test_version_comes_from_the_servers_info(nats_server: EmbeddedNatsServer, settings) -> None:
    printed = subprocess.run([nats_server.binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    expected = server_features.parse_version(printed.split(":")[-1].strip())

    async def body(conn):
        assert server_features.server_version(conn) == expected
        assert server_features.supports(conn, server_features.MESSAGE_TTL) == (expected >= (2, 11, 0))

    with_streams(settings, body, [])


def test_atomic_batches_by_feature(settings) -> None:
    async def body(conn):
        if server_features.supports(conn, server_features.ATOMIC_BATCH):
            await ensure_stream(conn, {"name": "ATOM", "subjects": ["atom.>"], "allow_atomic": True})
            result = await publish_atomic_batch(conn, [BatchMessage("atom.x", b"a"), BatchMessage("atom.x", b"b")])
            assert (result.count, _stored(await stream_info(conn, "ATOM"))) == (2, 2)
            return
        with pytest.raises(ServerFeatureError, match=r"allow_atomic.*needs nats-server 2\.12\.0") as refused:
            await ensure_stream(conn, {"name": "ATOM", "subjects": ["atom.>"], "allow_atomic": True})
        assert refused.value.reason == "server_too_old"
        assert await find_stream(conn, "ATOM") is None
        # On a server without atomic batches each message would be stored on its own: nothing is sent.
        with pytest.raises(ServerFeatureError, match=r"atomic batch publish .*needs nats-server 2\.12\.0"):
            await publish_atomic_batch(conn, MESSAGES)
        with pytest.raises(ServerFeatureError, match=r"Batcher\(atomic=True\) needs nats-server 2\.12\.0"):
            Batcher(conn, atomic=True)
        assert _stored(await stream_info(conn, "PLAIN")) == 0

    with_streams(settings, body, [PLAIN])


def test_fast_batches_by_feature(settings) -> None:
    async def body(conn):
        if server_features.supports(conn, server_features.FAST_BATCH):
            await ensure_stream(conn, {"name": "FAST", "subjects": ["fast.>"], "allow_batched": True})
            result = await publish_fast_batch(conn, [BatchMessage("fast.x", b"f%d" % i) for i in range(5)])
            assert (result.count, _stored(await stream_info(conn, "FAST"))) == (5, 5)
            return
        with pytest.raises(ServerFeatureError, match=r"allow_batched.*needs nats-server 2\.14\.0"):
            await ensure_stream(conn, {"name": "FAST", "subjects": ["fast.>"], "allow_batched": True})
        assert await find_stream(conn, "FAST") is None
        with pytest.raises(ServerFeatureError, match=r"fast batch publish .*needs nats-server 2\.14\.0") as refused:
            await publish_fast_batch(conn, MESSAGES)
        assert refused.value.reason == "server_too_old"
        assert _stored(await stream_info(conn, "PLAIN")) == 0

    with_streams(settings, body, [PLAIN])


def test_stream_fields_the_server_does_not_know_are_refused(settings) -> None:
    """Known new fields are checked before sending; any other field an old server drops is caught in its echo."""
    async def body(conn):
        counter = {"name": "COUNT", "subjects": ["count.>"], "allow_msg_counter": True}
        if server_features.supports(conn, server_features.STREAM_FIELDS["allow_msg_counter"]):
            assert (await ensure_stream(conn, counter))["info"]["config"]["allow_msg_counter"] is True
        else:
            with pytest.raises(ServerFeatureError, match=r"allow_msg_counter.*needs nats-server 2\.12\.0"):
                await ensure_stream(conn, counter)
            assert await find_stream(conn, "COUNT") is None
        # A field no release knows: 2.12+ refuses it (10025), 2.11 drops it and the echo check refuses.
        with pytest.raises(JetStreamError, match="no_such_field"):
            await ensure_stream(conn, {"name": "TYPO", "subjects": ["typo.>"], "no_such_field": True})
        assert await find_stream(conn, "TYPO") is None

    with_streams(settings, body, [])


@pytest.mark.parametrize(("mode", "flag"), [("atomic", "allow_atomic"), ("fast", "allow_batched")])
def test_publish_operator_by_feature(nats_conn: str, settings, mode: str, flag: str) -> None:
    from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator

    feature = server_features.ATOMIC_BATCH if mode == "atomic" else server_features.FAST_BATCH
    supported = with_streams(settings, lambda conn: _supports(conn, feature), [])
    with_streams(settings, lambda conn: asyncio.sleep(0),
                 [{"name": "OPS", "subjects": ["ops.>"], **({flag: True} if supported else {})}])
    op = JetStreamAtomicBatchPublishOperator(task_id="publish", subject="ops.x", mode=mode,
                                             messages=[{"data": {"id": i}} for i in range(3)])
    if supported:
        assert op.execute(context={})["count"] == 3
    else:
        with pytest.raises(ServerFeatureError, match=rf"needs nats-server {feature.since_text}"):
            op.execute(context={})
    stored = with_streams(settings, lambda conn: stream_info(conn, "OPS"), [])
    assert _stored(stored) == (3 if supported else 0)


async def _supports(conn, feature: server_features.Feature) -> bool:
    return server_features.supports(conn, feature)


@pytest.mark.parametrize(("mode", "flag"), [("atomic", "allow_atomic"), ("fast", "allow_batched")])
def test_spark_data_source_mode_by_feature(nats_server: EmbeddedNatsServer, settings, mode: str, flag: str) -> None:
    """The writer is built on the driver before any task runs: an old server is refused there."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from airflow_jetstream.spark.options import WriteOptions
    from airflow_jetstream.spark.writer import JetStreamWriter

    feature = server_features.ATOMIC_BATCH if mode == "atomic" else server_features.FAST_BATCH
    schema = StructType([StructField("subject", StringType()), StructField("payload", BinaryType())])
    options = WriteOptions.parse({"servers": nats_server.url, "stream": "SPARK", "mode": mode,
                                  "ledger_bucket": "none", "job_id": "compat"})

    async def body(conn):
        supported = server_features.supports(conn, feature)
        await ensure_stream(conn, {"name": "SPARK", "subjects": ["spark.>"], **({flag: True} if supported else {})})
        return supported

    if with_streams(settings, body, []):
        JetStreamWriter(options, schema)
    else:
        needs = rf"data source's mode={mode} needs nats-server {feature.since_text}"
        with pytest.raises(ServerFeatureError, match=needs):
            JetStreamWriter(options, schema)


class _Conn:
    """Just enough of a connection for the pure functions: nats-py's own ServerVersion of a release."""

    def __init__(self, version: str) -> None:
        self.nc = type("NC", (), {"connected_server_version": ServerVersion(version)})()


@pytest.mark.parametrize(("version", "atomic", "fast"), [
    ("2.11.11", False, False), ("2.12.8", True, False), ("2.14.0-RC.1", True, True), ("0.0.0-unknown", True, True),
])
def test_feature_table(version: str, atomic: bool, fast: bool) -> None:
    conn = _Conn(version)
    assert server_features.supports(conn, server_features.ATOMIC_BATCH) is atomic
    assert server_features.supports(conn, server_features.FAST_BATCH) is fast
    source = {"name": "AGG", "sources": [{"name": "ORIG", "consumer": {"name": "C", "deliver_subject": "d"}}]}
    if fast:
        server_features.check_stream_config(conn, source)
    else:
        with pytest.raises(ServerFeatureError, match=r"durable sourcing .*needs nats-server 2\.14\.0"):
            server_features.check_stream_config(conn, source)


def test_dropped_fields_ignore_unset_values() -> None:
    asked = {"name": "S", "allow_atomic": True, "mirror_direct": False, "description": "", "metadata": {}}
    assert server_features.dropped_fields(asked, {"name": "S"}) == ["allow_atomic"]
    assert server_features.dropped_fields(asked, {"name": "S", "allow_atomic": True}) == []


def test_a_servers_unknown_field_answer_names_the_release_it_needs() -> None:
    answer = {"code": 400, "err_code": 10025, "description": 'invalid JSON: json: unknown field "allow_batched"'}
    refusal = server_features.unknown_field_refusal(_Conn("2.12.8"), answer, "STREAM.CREATE.S")
    assert refusal is not None and refusal.reason == "server_too_old"
    assert "nats-server 2.12.8 does not know the field 'allow_batched'" in refusal.message
    assert "needs nats-server 2.14.0 or newer" in refusal.message
    typo = {**answer, "description": 'invalid JSON: json: unknown field "alow_atomic"'}
    assert server_features.unknown_field_refusal(_Conn("2.12.8"), typo, "STREAM.CREATE.S") is None

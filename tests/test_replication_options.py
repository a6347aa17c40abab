"""num_replicas / placement options on one server: validation before anything is sent, 'unset keeps
what is there', and the typed error for replicas a single server cannot hold (clusters: test_cluster_*)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_jetstream.client.admin.streams import (
    check_replicas,
    default_replicas,
    ensure_stream,
    normalize_placement,
    replication_config,
    stream_info,
)
from airflow_jetstream.client.advisories.capture import ensure_capture_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import InvalidRequestError, PlacementError, StreamConfigError
from airflow_jetstream.client.kv.job_records import put_job_record
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.client.sourcing.provision import DurableSource


def test_replicas_and_placement_are_validated_locally() -> None:
    assert check_replicas(None) is None and check_replicas("") is None and check_replicas("3") == 3
    for bad in (0, 6, True, 2.5, "three"):
        with pytest.raises(InvalidRequestError) as err:
            check_replicas(bad)
        assert err.value.reason == "invalid_replicas"
    assert normalize_placement({}) is None and normalize_placement(None) is None
    assert normalize_placement({"cluster": "east", "tags": "ssd, az:a"}) == {"cluster": "east", "tags": ["ssd", "az:a"]}
    for bad in ({"region": "x"}, {"cluster": 3}, {"tags": [1]}, "east"):
        with pytest.raises(InvalidRequestError) as err:
            normalize_placement(bad)
        assert err.value.reason == "invalid_placement"
    assert replication_config(None, None) == {}
    assert replication_config(2, {"tags": ["ssd"]}) == {"num_replicas": 2, "placement": {"tags": ["ssd"]}}
    with pytest.raises(InvalidRequestError):
        DurableSource(stream="AGG", source="ORIG", num_replicas=9).validated()
    with pytest.raises(StreamConfigError) as err:
        asyncio.run(ensure_stream(None, {"name": "S", "num_replicas": 0}))  # type: ignore[arg-type]
    assert err.value.reason == "invalid_replicas"


def test_single_server_defaults_to_one_replica_and_keeps_what_is_there(settings: ConnectionSettings) -> None:
    async def main() -> None:
        async with open_connection(settings) as conn:
            assert default_replicas(conn) == 1
            first = await ensure_capture_stream(conn, "ADV", max_age="1h", max_bytes=1 << 20)
            assert first["action"] == "created" and first["info"]["config"]["num_replicas"] == 1
            again = await ensure_capture_stream(conn, "ADV")  # every option unset: nothing changes
            assert again["action"] == "unchanged"
            cfg = (await stream_info(conn, "ADV"))["config"]
            assert (cfg["max_age"], cfg["max_bytes"]) == (3600 * 10**9, 1 << 20)
            changed = await ensure_capture_stream(conn, "ADV", max_age="2h")
            assert changed["changed"] == ["max_age"]

            with pytest.raises(PlacementError) as err:
                await ensure_capture_stream(conn, "ADV", num_replicas=3)
            assert err.value.reason == "replicas_need_cluster" and "num_replicas=1" in str(err.value)
            assert (await stream_info(conn, "ADV"))["config"]["num_replicas"] == 1

            await BatchLedger.open(conn, "ledger_r1")
            assert (await stream_info(conn, "KV_ledger_r1"))["config"]["num_replicas"] == 1
            with pytest.raises(PlacementError):
                await BatchLedger.open(conn, "ledger_r1", replicas=3)
            with pytest.raises(PlacementError):
                await put_job_record(conn, "job-1", {"state": "committed"}, bucket="jobs_r3", replicas=3)

    asyncio.run(main())

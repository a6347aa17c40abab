"""Leader elections are typed and retried; permission refusals of the JetStream API fail fast and are not retried."""

from __future__ import annotations

import asyncio
import logging

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import (
    InvalidSettingsError,
    LeaderUnavailableError,
    PermissionDeniedError,
    RequestTimeoutError,
    StreamNotFoundError,
    error_from_api,
)
from airflow_jetstream.client.settings import ConnectionSettings, settings_from_fields
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.conftest import ServerFactory
from tests.support.nats_calls import request_endings


def cluster_settings(cluster: EmbeddedNatsCluster, **kwargs) -> ConnectionSettings:
    kwargs.setdefault("request_timeout", 2)
    return ConnectionSettings(servers=cluster.servers, connect_timeout=2, **kwargs)


def test_leader_wait_is_a_connection_field() -> None:
    assert ConnectionSettings().leader_wait == 30.0
    assert settings_from_fields({"leader_wait": "12.5"}).leader_wait == 12.5
    with pytest.raises(InvalidSettingsError, match="leader_wait"):
        ConnectionSettings(leader_wait=-1)


def test_temporarily_unavailable_is_leader_unavailable() -> None:
    err = error_from_api({"code": 503, "err_code": 10008, "description": "JetStream system temporarily unavailable"})
    assert isinstance(err, LeaderUnavailableError) and isinstance(err, RequestTimeoutError)
    assert err.reason == "leader_unavailable"


def test_stream_info_rides_out_a_stream_leader_kill(
    nats_cluster_module: EmbeddedNatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = nats_cluster_module

    async def main() -> dict:
        async with open_connection(cluster_settings(cluster)) as conn:
            await ensure_stream(conn, {"name": "RETRY", "subjects": ["retry.>"], "num_replicas": 3})
            leader = cluster.stream_leader("RETRY")
            # the meta leader answers "stream not found" at once, so it is never mistaken for an election
            with pytest.raises(StreamNotFoundError):
                await stream_info(conn, "NOPE")
            cluster.kill(leader)
            try:
                return await stream_info(conn, "RETRY")
            finally:
                cluster.restart(leader)

    with caplog.at_level(logging.WARNING, logger="airflow_jetstream.client.connection"):
        info = asyncio.run(main())
    assert info["config"]["name"] == "RETRY"
    retries = [r.getMessage() for r in caplog.records if "leader unavailable" in r.getMessage()]
    assert retries, "the call during the election was expected to be retried at least once"
    assert "retry 1 in" in retries[0] and "leader_wait left" in retries[0]


def test_leader_wait_zero_raises_leader_unavailable_at_once(nats_cluster_module: EmbeddedNatsCluster) -> None:
    cluster = nats_cluster_module

    async def main() -> None:
        async with open_connection(cluster_settings(cluster, leader_wait=0, request_timeout=1)) as conn:
            await ensure_stream(conn, {"name": "NOWAIT", "subjects": ["nowait.>"], "num_replicas": 3})
            leader = cluster.stream_leader("NOWAIT")
            cluster.kill(leader)
            try:
                with pytest.raises(LeaderUnavailableError) as caught:
                    await stream_info(conn, "NOWAIT")
                assert caught.value.reason == "leader_unavailable"
                assert "electing a leader" in str(caught.value)
            finally:
                cluster.restart(leader)

    asyncio.run(main())


def test_api_permission_violation_fails_fast_and_is_not_retried(nats_server_factory: ServerFactory) -> None:
    server = nats_server_factory(config={"authorization": {"users": [{
        "user": "reader", "password": "pw-reader-123",
        "permissions": {"publish": {"deny": ["$JS.API.STREAM.INFO.SECRET"]}},
    }]}})
    settings = ConnectionSettings(servers=server.url, user="reader", password="pw-reader-123",
                                  connect_timeout=2, request_timeout=20, leader_wait=60)

    async def main() -> tuple[PermissionDeniedError, list[tuple[str, str]]]:
        async with open_connection(settings) as conn:
            with request_endings(conn) as ended, pytest.raises(PermissionDeniedError) as caught:
                await stream_info(conn, "SECRET")
            return caught.value, ended

    err, ended = asyncio.run(main())
    assert err.reason == "permission_denied"
    assert err.subject == "$JS.API.STREAM.INFO.SECRET"
    assert "$JS.API.STREAM.INFO.SECRET" in str(err)
    # sent once (not retried for the 60 s leader wait) and ended by the refusal, not by the 20 s request timeout
    assert ended == [("$JS.API.STREAM.INFO.SECRET", "cancelled")]

"""JetStreamHook and the ``nats`` connection, resolved from AIRFLOW_CONN_* like a real deployment."""

from __future__ import annotations

import asyncio
import json
import logging
import traceback

import pytest

from airflow_jetstream.client import ConnectionSettings
from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.connection import account_info
from airflow_jetstream.client.errors import InvalidSettingsError, StreamNotFoundError
from airflow_jetstream.hooks.jetstream import JetStreamHook, settings_from_connection
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from tests.conftest import AUTH_PASSWORD, AUTH_TOKEN, AUTH_USER, set_nats_connection
from tests.support.polling import wait_until


class _Conn:
    """The attributes of an Airflow Connection that the mapping reads."""

    def __init__(self, host=None, port=None, login=None, password=None, schema=None, extra=None):
        self.conn_id = "test"
        self.host, self.port, self.login, self.password, self.schema = host, port, login, password, schema
        self._extra = extra or {}

    @property
    def extra_dejson(self):
        return self._extra


def test_settings_from_connection_maps_every_field(tls_files):
    conn = _Conn(
        host="n1,tls://n2:4333", port=4300, login="u", password="p",
        extra={"tls_ca_file": str(tls_files.ca), "tls_verify": "false", "connect_timeout": "3.5",
               "client_name": "etl", "domain": "hub", "request_timeout": 9},
    )
    settings = settings_from_connection(conn)
    assert settings.servers == ("nats://n1:4300", "tls://n2:4333")
    assert (settings.user, settings.password) == ("u", "p")
    assert settings.tls_verify is False
    assert settings.connect_timeout == 3.5 and settings.request_timeout == 9.0
    assert settings.api_subject_prefix == "$JS.hub.API"
    assert settings.connect_options()["servers"] == ["tls://n1:4300", "tls://n2:4333"]


def test_settings_defaults_port_and_host():
    settings = settings_from_connection(_Conn(host="nats.internal"))
    assert settings.servers == ("nats://nats.internal:4222",)
    assert settings.tls_verify is True and settings.uses_tls is False


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"tokn": "x"}, "unknown extra field(s) tokn"),
        ({"tls_verify": "maybe"}, "true or false"),
        ({"connect_timeout": "soon"}, "number of seconds"),
        ({"creds_file": "/nonexistent.creds"}, "does not exist"),
    ],
)
def test_malformed_extras_are_typed_errors(extra, fragment):
    with pytest.raises(InvalidSettingsError) as info:
        settings_from_connection(_Conn(host="h", extra=extra))
    assert fragment in str(info.value)


def test_bad_port_is_a_typed_error():
    with pytest.raises(InvalidSettingsError, match="port"):
        settings_from_connection(_Conn(host="h", port="abc"))


def test_hook_resolves_env_connection_and_runs(nats_conn, nats_server):
    hook = JetStreamHook()
    assert hook.settings.servers == (nats_server.url,)
    result = hook.run(ensure_stream, {"name": "HOOKED", "subjects": ["hooked.>"]})
    assert result["action"] == "created"
    assert hook.run(stream_info, "HOOKED")["config"]["subjects"] == ["hooked.>"]


def test_hook_run_closes_connections_also_on_error(nats_conn, nats_server):
    hook = JetStreamHook()

    async def boom(conn):
        assert conn.nc.is_connected
        raise KeyError("inside")

    with pytest.raises(KeyError):
        hook.run(boom)
    hook.run(account_info)
    wait_until(lambda: nats_server.monitor("connz")["num_connections"] == 0, "the server to see both closes")


def test_hook_run_raises_the_real_error_alone(nats_conn):
    """Not chained to 'RuntimeError: no running event loop' (asyncio.run once ran inside that except)."""
    with pytest.raises(StreamNotFoundError) as raised:
        JetStreamHook().run(stream_info, "MISSING")
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    assert "no running event loop" not in "".join(traceback.format_exception(raised.value))


def test_hook_run_inside_a_running_event_loop(nats_conn):
    hook = JetStreamHook()

    async def caller():
        return hook.run(account_info)

    assert asyncio.run(caller())["type"].endswith("account_info_response")


def test_hook_async_connection(nats_conn):
    hook = JetStreamHook()

    async def go():
        async with hook.connection() as conn:
            return await account_info(conn)

    assert asyncio.run(go())["streams"] == 0


def test_test_connection_live_and_dead(monkeypatch, nats_server_factory):
    live = nats_server_factory()
    set_nats_connection(monkeypatch, "nats_live", live.url)
    ok, message = JetStreamHook("nats_live").test_connection()
    assert ok is True
    assert "JetStream enabled" in message

    dead = nats_server_factory()
    dead_url = dead.url
    dead.stop()
    set_nats_connection(monkeypatch, "nats_dead", dead_url, extra={"connect_timeout": 1})
    ok, message = JetStreamHook("nats_dead").test_connection()
    assert ok is False
    assert "could not connect" in message and dead_url in message


def test_test_connection_reports_bad_credentials(monkeypatch, user_server):
    set_nats_connection(monkeypatch, "nats_bad", user_server.url, login=AUTH_USER, password="not-the-password")
    ok, message = JetStreamHook("nats_bad").test_connection()
    assert ok is False
    assert "refused the credentials" in message
    assert "not-the-password" not in message


def test_secrets_never_leak(monkeypatch, user_server, token_server, caplog, capsys):
    """Password/token stay out of repr, exception text, results and logs."""
    caplog.set_level(logging.DEBUG)
    set_nats_connection(monkeypatch, "nats_user", user_server.url, login=AUTH_USER, password=AUTH_PASSWORD)
    set_nats_connection(monkeypatch, "nats_token", token_server.url, extra={"token": AUTH_TOKEN})
    texts = []
    for conn_id in ("nats_user", "nats_token"):
        hook = JetStreamHook(conn_id)
        result = JetStreamEnsureStreamOperator(
            task_id="t", nats_conn_id=conn_id, config={"name": "SECRETIVE", "subjects": ["s.>"]}
        ).execute(context={})
        texts += [repr(hook), repr(hook.settings), str(hook.settings), json.dumps(result, default=str)]
        texts.append(str(hook.test_connection()))
    wrong = JetStreamHook("nats_user", password="wrong-" + AUTH_PASSWORD)
    texts.append(str(wrong.test_connection()))
    captured = capsys.readouterr()
    texts += [caplog.text, captured.out, captured.err]
    assert "Created stream SECRETIVE" in captured.out + caplog.text
    joined = "\n".join(texts)
    assert AUTH_PASSWORD not in joined
    assert AUTH_TOKEN not in joined


def test_secrets_are_registered_with_airflow_masker(monkeypatch, user_server):
    from airflow.sdk._shared.secrets_masker import redact

    set_nats_connection(monkeypatch, "nats_masked", user_server.url, login=AUTH_USER, password=AUTH_PASSWORD)
    hook = JetStreamHook("nats_masked")
    assert hook.settings.password == AUTH_PASSWORD
    assert AUTH_PASSWORD not in str(redact(f"connecting with {AUTH_PASSWORD}"))


def test_settings_overrides_win(nats_conn):
    hook = JetStreamHook(request_timeout=1.25)
    assert hook.settings.request_timeout == 1.25
    assert isinstance(hook.get_conn(), ConnectionSettings)

"""Connecting with every auth method, TLS, and the typed errors of each failure (real nats-server)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.connection import account_info, connect
from airflow_jetstream.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    InvalidSettingsError,
    JetStreamNotEnabledError,
    PermissionDeniedError,
    TLSConfigurationError,
)
from tests.conftest import AUTH_PASSWORD, AUTH_TOKEN, AUTH_USER


def _account(settings: ConnectionSettings) -> dict:
    async def go() -> dict:
        async with open_connection(settings) as conn:
            return await account_info(conn)

    return asyncio.run(go())


def _connect_error(settings: ConnectionSettings) -> Exception:
    async def go() -> None:
        conn = await connect(settings)
        await conn.close()

    with pytest.raises(ConnectionFailedError) as info:
        asyncio.run(go())
    return info.value


def test_plain_connection_reaches_jetstream(settings):
    assert _account(settings)["type"] == "io.nats.jetstream.api.v1.account_info_response"


def test_user_password(user_server):
    ok = ConnectionSettings(servers=user_server.url, user=AUTH_USER, password=AUTH_PASSWORD)
    assert _account(ok)["streams"] == 0
    err = _connect_error(ok.with_overrides(password="wrong"))
    assert isinstance(err, AuthenticationError)
    assert err.reason == "authentication_failed"
    assert "wrong" not in str(err) and AUTH_PASSWORD not in str(err)


def test_token(token_server):
    assert _account(ConnectionSettings(servers=token_server.url, token=AUTH_TOKEN))["streams"] == 0
    err = _connect_error(ConnectionSettings(servers=token_server.url, token="bad-token-value"))
    assert isinstance(err, AuthenticationError)
    assert "bad-token-value" not in str(err)


def test_nkey(nkey_server, nkey_user):
    seed, _public = nkey_user
    assert _account(ConnectionSettings(servers=nkey_server.url, nkey_seed_secret=seed))["streams"] == 0
    from tests.support.nkeys_util import new_user_nkey

    other_seed, _ = new_user_nkey()
    err = _connect_error(ConnectionSettings(servers=nkey_server.url, nkey_seed_secret=other_seed))
    assert isinstance(err, AuthenticationError)
    assert other_seed not in str(err)


def test_tls_with_trusted_ca(tls_server, tls_files):
    settings = ConnectionSettings(servers=tls_server.url, tls_ca_file=str(tls_files.ca))
    assert _account(settings)["streams"] == 0


def test_tls_with_untrusted_ca(tls_server, tmp_path):
    from tests.support.tls import make_tls_files

    other = make_tls_files(tmp_path / "other", ca_name="some other CA")
    err = _connect_error(ConnectionSettings(servers=tls_server.url, tls_ca_file=str(other.ca)))
    assert isinstance(err, TLSConfigurationError)
    assert "tls_ca_file" in str(err)


def test_tls_required_but_not_configured(tls_server):
    err = _connect_error(ConnectionSettings(servers=tls_server.url.replace("tls://", "nats://"),
                                            connect_timeout=2))
    assert isinstance(err, TLSConfigurationError)


def test_unreachable_server_fails_within_timeout(nats_server_factory):
    server = nats_server_factory()
    url = server.url
    server.stop()
    err = _connect_error(ConnectionSettings(servers=url, connect_timeout=1))
    assert type(err) is ConnectionFailedError
    assert err.reason == "server_unreachable"
    assert url in str(err)


def test_servers_that_all_refuse_fail_at_once_not_after_the_connect_timeout(nats_server_factory):
    stopped = [nats_server_factory() for _ in range(2)]
    urls = [server.url for server in stopped]
    for server in stopped:
        server.stop()
    err = _connect_error(ConnectionSettings(servers=",".join(urls), connect_timeout=120))
    assert type(err) is ConnectionFailedError and err.reason == "server_unreachable"
    assert "every server refused the connection" in str(err), "the refusal ends the wait, not the 120 s timeout"
    assert all(url in str(err) for url in urls)


def test_second_server_in_list_is_used(nats_server_factory):
    alive = nats_server_factory()
    dead = nats_server_factory()
    dead_url = dead.url
    dead.stop()
    settings = ConnectionSettings(servers=f"{dead_url},{alive.url}", connect_timeout=1)
    assert _account(settings)["streams"] == 0


def test_permission_denied_names_the_subject(user_server):
    settings = ConnectionSettings(servers=user_server.url, user=AUTH_USER, password=AUTH_PASSWORD)

    async def go() -> None:
        async with open_connection(settings) as conn:
            await conn.nc.publish("forbidden.orders", b"x")
            await conn.raise_if_denied("forbidden.orders")

    with pytest.raises(PermissionDeniedError) as info:
        asyncio.run(go())
    assert info.value.subject == "forbidden.orders"
    assert "forbidden.orders" in str(info.value)


def test_jetstream_disabled_account(nats_server_factory):
    server = nats_server_factory(config={"jetstream": "disabled"})

    async def go() -> None:
        async with open_connection(ConnectionSettings(servers=server.url, request_timeout=1)) as conn:
            await account_info(conn)

    with pytest.raises(JetStreamNotEnabledError):
        asyncio.run(go())


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"servers": "http://h:1"}, "scheme"),
        ({"servers": "nats://u:p@h:4222"}, "credentials"),
        ({"servers": ""}, "no NATS server"),
        ({"servers": "h:notaport"}, "invalid port"),
        ({"token": "t", "user": "u"}, "either a token"),
        ({"tls_ca_file": "/nonexistent/ca.pem"}, "does not exist"),
        ({"tls_cert_file": "/etc/hostname"}, "tls_key_file"),
        ({"domain": "hub", "api_prefix": "$JS.x.API"}, "domain"),
    ],
)
def test_malformed_settings_are_rejected(kwargs, fragment):
    with pytest.raises(InvalidSettingsError) as info:
        ConnectionSettings(**kwargs)
    assert fragment in str(info.value)


def test_repr_hides_secrets():
    settings = ConnectionSettings(user="u", password="pw-secret", nkey_seed_secret="SUSEEDSECRET")
    text = repr(settings) + str(settings)
    assert "pw-secret" not in text and "SUSEEDSECRET" not in text
    assert "password='***'" in text


def test_creds_file_decentralized_auth(nats_server_factory, tmp_path):
    from tests.support.jwt_auth import make_decentralized_auth

    auth = make_decentralized_auth(tmp_path / "auth")
    server = nats_server_factory(config=auth.server_config)
    settings = ConnectionSettings(servers=server.url, creds_file=str(auth.creds_file))
    assert _account(settings)["limits"]["max_streams"] == -1
    assert auth.user_seed in settings.secrets() and auth.user_jwt in settings.secrets()
    assert auth.user_seed not in repr(settings)

    stranger = make_decentralized_auth(tmp_path / "other")
    err = _connect_error(ConnectionSettings(servers=server.url, creds_file=str(stranger.creds_file)))
    assert isinstance(err, AuthenticationError)
    assert stranger.user_seed not in str(err) and stranger.user_jwt not in str(err)


@pytest.mark.parametrize("seed", ["SUAnotaseed", "not-a-seed-at-all",
                                  "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"])  # a public key
def test_a_malformed_nkey_seed_is_a_typed_error_not_an_assertion(nkey_server, seed):
    """nats-py refuses the seed before connecting; closing the client that never connected raised
    ``AssertionError: Client.connect must be called first`` and hid it (the view answered 500)."""
    err = _connect_error(ConnectionSettings(servers=nkey_server.url, nkey_seed_secret=seed))
    assert isinstance(err, AuthenticationError) and "nkey seed is not a valid NATS user seed" in str(err)
    assert seed not in str(err)


def test_a_creds_file_that_is_not_one_is_a_typed_error(tmp_path):
    """nats-py fails on it with a TypeError inside the connect (5 s later, "could not connect")."""
    garbage = tmp_path / "garbage.creds"
    garbage.write_bytes(b"\xff\xfe not a creds file SUSECRETLOOKING")
    with pytest.raises(InvalidSettingsError, match="is not a NATS credentials file") as info:
        ConnectionSettings(servers="nats://127.0.0.1:4222", creds_file=str(garbage))
    assert "SUSECRETLOOKING" not in str(info.value)

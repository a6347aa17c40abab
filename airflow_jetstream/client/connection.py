"""Open NATS connections from :class:`ConnectionSettings` and make JetStream API requests.

Connect failures are turned into typed errors quickly: a refused credential or a failed TLS
handshake aborts at once instead of retrying until the timeout, and an unreachable server fails
within ``connect_timeout`` per server.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from airflow_jetstream.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    InvalidSettingsError,
    JetStreamError,
    JetStreamNotEnabledError,
    PermissionDeniedError,
    RequestTimeoutError,
    TLSConfigurationError,
    error_from_api,
)
from airflow_jetstream.client.settings import ConnectionSettings

_PERMISSION = re.compile(r'permissions violation for (publish|subscription) to "?([^"\s]+)"?', re.I)


def _classify_connect_error(exc: BaseException) -> JetStreamError | None:
    """A fatal (non-retryable) connect error as a typed error, or None when retrying may help."""
    text = str(exc).lower()
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in text:
        return AuthenticationError(
            "the NATS server refused the credentials (user/password, token, nkey or creds file); "
            "check the connection's secrets"
        )
    if "authentication" in text and "expired" in text:
        return AuthenticationError("the NATS user credentials have expired; issue new creds")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSConfigurationError(
            f"TLS certificate verification failed ({exc.verify_message}); set the connection's "
            "tls_ca_file to the CA that signed the server certificate, or check tls_hostname"
        )
    if isinstance(exc, ssl.SSLError):
        return TLSConfigurationError(f"TLS handshake failed ({exc.reason or exc}); check the TLS settings")
    if isinstance(exc, nats.errors.SecureConnRequiredError):
        return TLSConfigurationError("the server requires TLS; use a tls:// server or set TLS options")
    if isinstance(exc, nats.errors.SecureConnWantedError):
        return TLSConfigurationError("TLS is configured but the server does not offer TLS; remove the TLS options")
    if isinstance(exc, nats.errors.InvalidUserCredentialsError):
        return AuthenticationError("the creds file is not a valid NATS credentials file")
    if "nkey" in text and ("invalid" in text or "seed" in text):
        return AuthenticationError("the nkey seed is not a valid NATS user seed (it starts with 'SU')")
    return None


class JetStreamConnection:
    """An open NATS connection with its JetStream context and API helpers.

    Use :func:`open_connection` rather than building one directly.
    """

    def __init__(self, nc: NATS, settings: ConnectionSettings) -> None:
        self.nc = nc
        self.settings = settings
        self.js: JetStreamContext = nc.jetstream(
            prefix=settings.api_subject_prefix, timeout=settings.request_timeout
        )
        self.permission_violations: list[tuple[str, str]] = []

    @property
    def api_prefix(self) -> str:
        return self.settings.api_subject_prefix

    @property
    def max_payload(self) -> int:
        return self.nc.max_payload

    def _note_error(self, exc: BaseException) -> None:
        match = _PERMISSION.search(str(exc))
        if match:
            self.permission_violations.append((match.group(1).lower(), match.group(2)))

    def permission_error(self, subject: str) -> PermissionDeniedError | None:
        """The permission error recorded for ``subject``, if the server reported one."""
        for op, denied in self.permission_violations:
            if denied == subject:
                return PermissionDeniedError(
                    f"permission denied: this NATS user may not {op} to {denied!r}; grant it in the "
                    "server's authorization config or use another user",
                    subject=denied,
                )
        return None

    async def raise_if_denied(self, subject: str) -> None:
        """Round-trip to the server, then raise if ``subject`` was refused by permissions.

        Permission errors come back asynchronously (``-ERR``); two PING/PONG round trips make sure
        the server's answer to everything sent before has been read.
        """
        for _ in range(2):
            await self.nc.flush(timeout=self.settings.request_timeout)
        denied = self.permission_error(subject)
        if denied:
            raise denied

    async def request(self, subject: str, payload: bytes = b"", *, timeout: float | None = None,
                      headers: dict[str, str] | None = None) -> nats.aio.msg.Msg:
        """A core request with typed timeout and permission errors."""
        timeout = timeout or self.settings.request_timeout
        try:
            return await self.nc.request(subject, payload, timeout=timeout, headers=headers)
        except nats.errors.NoRespondersError:
            await self.raise_if_denied(subject)
            raise JetStreamNotEnabledError(
                f"no responder for {subject!r}: JetStream is not enabled for this account, or the "
                "JetStream domain / API prefix of the connection is wrong"
            ) from None
        except nats.errors.TimeoutError:
            await self.raise_if_denied(subject)
            raise RequestTimeoutError(f"no reply to {subject!r} within {timeout}s") from None

    async def api_request(self, api: str, body: dict[str, Any] | None = None, *,
                          timeout: float | None = None, context: str = "") -> dict[str, Any]:
        """Send ``body`` to ``<api prefix>.<api>`` and return the JSON reply, raising typed errors."""
        subject = f"{self.api_prefix}.{api}"
        payload = json.dumps(body).encode() if body is not None else b""
        msg = await self.request(subject, payload, timeout=timeout)
        try:
            reply = json.loads(msg.data or b"{}")
        except ValueError:
            raise JetStreamError(f"{context or api}: the server answered non-JSON data") from None
        if isinstance(reply, dict) and "error" in reply:
            raise error_from_api(reply["error"], context=context or api)
        return reply

    async def close(self) -> None:
        """Flush what was published (the server has it once the PONG is back), then close.

        Not ``drain()``: it waits for every subscription's queue to empty, and a cancelled pull
        fetch leaves messages queued that nobody reads, so drain would wait its full 30 s timeout.
        Unacknowledged messages left behind are redelivered by the server after their ack wait.
        """
        if self.nc.is_closed:
            return
        try:
            if self.nc.is_connected:
                await self.nc.flush(timeout=self.settings.request_timeout)
        except (TimeoutError, nats.errors.Error):
            pass
        finally:
            await self.nc.close()


async def connect(settings: ConnectionSettings, **options: Any) -> JetStreamConnection:
    """Open a connection; raises a typed :class:`ConnectionFailedError` subclass on failure."""
    nc = NATS()
    holder: dict[str, JetStreamConnection] = {}
    fatal: asyncio.Future[JetStreamError] = asyncio.get_running_loop().create_future()
    last_error: list[BaseException] = []

    async def error_cb(exc: Exception) -> None:
        if "conn" in holder:
            holder["conn"]._note_error(exc)
            return
        last_error.append(exc)
        typed = _classify_connect_error(exc)
        if typed is not None and not fatal.done():
            fatal.set_result(typed)

    kwargs = settings.connect_options()
    kwargs.update(
        error_cb=error_cb,
        max_reconnect_attempts=options.pop("max_reconnect_attempts", 60),
        reconnect_time_wait=options.pop("reconnect_time_wait", 0.5),
        **options,
    )
    budget = settings.connect_timeout * max(1, len(settings.servers)) + 1.0
    task = asyncio.ensure_future(nc.connect(**kwargs))
    done, _ = await asyncio.wait({task, fatal}, timeout=budget, return_when=asyncio.FIRST_COMPLETED)
    if task in done and task.exception() is None:
        fatal.cancel()
        conn = JetStreamConnection(nc, settings)
        holder["conn"] = conn
        return conn
    error: JetStreamError
    if fatal.done() and not fatal.cancelled():
        error = fatal.result()
    elif task.done() and task.exception() is not None:
        exc = task.exception()
        error = _classify_connect_error(exc) or _unreachable(settings, last_error or [exc])
    else:
        error = _unreachable(settings, last_error)
    task.cancel()
    fatal.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await nc.close()
    raise error


def _unreachable(settings: ConnectionSettings, errors: list[BaseException]) -> ConnectionFailedError:
    seen = f" (last error: {type(errors[-1]).__name__})" if errors else ""
    return ConnectionFailedError(
        f"could not connect to NATS at {', '.join(settings.servers)} within "
        f"{settings.connect_timeout}s per server{seen}; check that the server runs and the "
        "connection's host/port are right"
    )


@asynccontextmanager
async def open_connection(settings: ConnectionSettings, **options: Any) -> AsyncIterator[JetStreamConnection]:
    """``async with open_connection(settings) as conn:`` - always closes, also on error."""
    conn = await connect(settings, **options)
    try:
        yield conn
    finally:
        await conn.close()


async def account_info(conn: JetStreamConnection) -> dict[str, Any]:
    """JetStream account info; proves JetStream is reachable with these settings."""
    try:
        return await conn.api_request("INFO", context="JetStream account info")
    except RequestTimeoutError:
        raise JetStreamNotEnabledError(
            "JetStream did not answer: it is not enabled for this account or the domain/API prefix is wrong"
        ) from None


__all__ = ["InvalidSettingsError", "JetStreamConnection", "account_info", "connect", "open_connection"]

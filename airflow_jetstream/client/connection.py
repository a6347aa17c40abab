"""Open NATS connections from :class:`ConnectionSettings` and make JetStream API requests.

Connect failures are turned into typed errors quickly: a refused credential or a failed TLS
handshake aborts at once instead of retrying until the timeout, and an unreachable server fails
within ``connect_timeout`` per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import importlib
import json
import logging
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from airflow_jetstream.client import server_features
from airflow_jetstream.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    JetStreamError,
    JetStreamNotEnabledError,
    LeaderUnavailableError,
    NatsPyVersionError,
    PermissionDeniedError,
    RequestTimeoutError,
    TLSConfigurationError,
    error_from_api,
)
from airflow_jetstream.client.natspy_internals import (
    check_connected,
    check_natspy,
    install_header_parser,
    install_pong_guard,
    server_info,
    with_pending_size,
)
from airflow_jetstream.client.reading.headers import parse_header_lines
from airflow_jetstream.client.retry import Deadline, is_leader_unavailable
from airflow_jetstream.client.retry import retry as retry_rule
from airflow_jetstream.client.settings import ConnectionSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
#: A server that answers no PING for ``PING_INTERVAL * (MAX_OUTSTANDING_PINGS + 1)`` seconds (a stalled or
#: partitioned server) is given up and the client reconnects, to another server of the cluster if there is one.
#: nats-py's defaults (120 s, 2) left a stalled connection for up to 6 minutes.
PING_INTERVAL, MAX_OUTSTANDING_PINGS = 10, 2
#: What to check when a leader stays unavailable for the whole ``leader_wait``.
QUORUM_ADVICE = "check that a quorum of the cluster's servers runs, then re-run"

#: Unreported permission violations kept per connection (a pooled connection lives for the whole process).
_VIOLATIONS_KEPT = 64
_PERMISSION = re.compile(r'permissions violation for (publish|subscription) to "?([^"\s]+)"?', re.I)


def _api_transient(exc: JetStreamError) -> str | None:
    """What an API call retries: no leader (an election), and a placement refused only because servers of the
    cluster are offline (right after startup they join within seconds; a failed placement created nothing)."""
    if exc.reason == "peers_offline":
        return "servers of the cluster are offline or still joining"
    return is_leader_unavailable(exc)


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
        install_header_parser(nc, parse_header_lines)  # nats-py's parser, keeping repeated header names
        self.js: JetStreamContext = nc.jetstream(
            prefix=settings.api_subject_prefix, timeout=settings.request_timeout
        )
        #: (operation, subject) of permission violations the server reported and no error has reported yet.
        self.permission_violations: deque[tuple[str, str]] = deque(maxlen=_VIOLATIONS_KEPT)
        #: Called with each subject the server refuses: a request, and a KV call on its bucket's, ends at once.
        self.denial_listeners: list[Callable[[str], None]] = []

    @property
    def api_prefix(self) -> str:
        return self.settings.api_subject_prefix

    def with_api_prefix(self, api_prefix: str) -> JetStreamConnection:
        """This connection with its JetStream API requests (:meth:`api_request` and ``.js``) sent to another
        prefix (a domain's): the same NATS connection, permission violations and listeners."""
        view = copy.copy(self)
        view.settings = dataclasses.replace(self.settings, domain=None, api_prefix=api_prefix)
        view.js = self.nc.jetstream(prefix=api_prefix, timeout=self.settings.request_timeout)
        return view

    @property
    def clustered(self) -> bool:
        """Whether the connected server is part of a cluster (its INFO names one)."""
        return bool(server_info(self.nc).get("cluster"))

    def unanswered(self, message: str) -> RequestTimeoutError:
        """The error for a request that got no answer: on a cluster a :class:`LeaderUnavailableError`
        (an election is the usual cause, and it is retried), on a single server a plain timeout."""
        if self.clustered:
            return LeaderUnavailableError(f"{message}; the stream/consumer may be electing a leader")
        return RequestTimeoutError(message)

    def _note_error(self, exc: BaseException) -> None:
        match = _PERMISSION.search(str(exc))
        if match:
            self.permission_violations.append((match.group(1).lower(), match.group(2)))
            for listener in list(self.denial_listeners):
                listener(match.group(2))

    def take_violation(self, concerns: Callable[[str], bool]) -> tuple[str, str] | None:
        """Remove and return the oldest unreported violation whose subject ``concerns`` accepts.

        Each violation the server reports is the answer to one message, so it explains one failure:
        once taken, a later timeout on the same subject (permissions fixed since) is a timeout again.
        """
        for violation in self.permission_violations:
            if concerns(violation[1]):
                self.permission_violations.remove(violation)
                return violation
        return None

    def permission_error(self, subject: str) -> PermissionDeniedError | None:
        """The permission error for ``subject`` if the server reported one not reported yet (then taken)."""
        taken = self.take_violation(lambda denied: denied.lower() == subject.lower())
        if taken is None:
            return None
        return PermissionDeniedError(
            f"permission denied: this NATS user may not {taken[0]} to {subject!r}; grant it in the "
            "server's authorization config or use another user",
            subject=subject,
        )

    async def raise_if_denied(self, subject: str) -> None:
        """Round-trip to the server, then raise if ``subject`` was refused by permissions.

        Permission errors come back asynchronously (``-ERR``); two PING/PONG round trips make sure
        the server's answer to everything sent before has been read. While nats-py reconnects the
        round trips may time out: then only what was already reported is checked.
        """
        with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
            for _ in range(2):
                await self.nc.flush(timeout=self.settings.request_timeout)  # type: ignore[arg-type]  # float s work
        denied = self.permission_error(subject)
        if denied:
            raise denied

    async def request(self, subject: str, payload: bytes = b"", *, timeout: float | None = None,
                      headers: dict[str, str] | None = None) -> Msg:
        """A core request with typed timeout and permission errors.

        A permission violation for ``subject`` (the server's ``-ERR``, reported to the error
        callback at once) fails the request immediately instead of after ``timeout``.
        """
        timeout = timeout or self.settings.request_timeout
        ask = asyncio.ensure_future(self.nc.request(subject, payload, timeout=timeout, headers=headers))

        def on_denied(refused: str) -> None:  # nats-py lowercases the server's -ERR text: compare without case
            if refused.lower() == subject.lower():
                ask.cancel()

        self.denial_listeners.append(on_denied)
        try:
            return await ask
        except asyncio.CancelledError:
            if (task := asyncio.current_task()) is not None and task.cancelling():
                raise  # cancelled from outside, not by a refusal
            raise self.permission_error(subject) or RequestTimeoutError(f"no reply to {subject!r}") from None
        except nats.errors.NoRespondersError:
            await self.raise_if_denied(subject)
            raise JetStreamNotEnabledError(
                f"no responder for {subject!r}: JetStream is not enabled for this account, or the "
                "JetStream domain / API prefix of the connection is wrong"
            ) from None
        except nats.errors.TimeoutError:
            raise self.permission_error(subject) or RequestTimeoutError(
                f"no reply to {subject!r} within {timeout}s") from None
        finally:
            self.denial_listeners.remove(on_denied)

    async def api_request(self, api: str, body: dict[str, Any] | None = None, *,
                          timeout: float | None = None, context: str = "", retry: bool = True) -> dict[str, Any]:
        """Send ``body`` to ``<api prefix>.<api>`` and return the JSON reply, raising typed errors.

        No reply in time from a clustered server, or a "temporarily unavailable" answer, is a
        :class:`LeaderUnavailableError` retried for ``settings.leader_wait`` seconds (a cluster electing
        a leader; on a single server no reply stays a :class:`RequestTimeoutError`); ``retry=False``
        turns that off. JetStream API calls are idempotent (create/update with the same config,
        delete, info, reset to a given sequence), so a retry after a lost reply is safe.
        """
        subject = f"{self.api_prefix}.{api}"
        payload = json.dumps(body).encode() if body is not None else b""
        what = context or api

        async def once() -> dict[str, Any]:
            try:
                msg = await self.request(subject, payload, timeout=timeout)
            except RequestTimeoutError as exc:
                raise self.unanswered(f"{what}: {exc.message}") from None
            try:
                reply = json.loads(msg.data or b"{}")
            except ValueError:
                raise JetStreamError(f"{what}: the server answered non-JSON data") from None
            if isinstance(reply, dict) and "error" in reply:
                refusal = server_features.unknown_field_refusal(self, reply["error"], what)
                raise refusal or error_from_api(reply["error"], context=what)
            return cast(dict[str, Any], reply)

        return await self.retry_leader(what, once, transient=_api_transient) if retry else await once()

    async def retry_leader(self, what: str, attempt: Callable[[], Awaitable[T]], *,
                           transient: Callable[[JetStreamError], str | None] = is_leader_unavailable,
                           deadline: Deadline | None = None, wait: float | None = None, advice: str = "",
                           before_retry: Callable[[], Awaitable[None]] | None = None,
                           logger: logging.Logger = log) -> T:
        """Run ``attempt``, retried while it raises :class:`LeaderUnavailableError` (or what ``transient`` names) for
        ``settings.leader_wait`` seconds from the first failure, until ``deadline``, or for ``wait`` seconds from now
        (:func:`~airflow_jetstream.client.retry.retry`); the give-up message ends with ``advice`` and
        :data:`QUORUM_ADVICE`."""
        budget = self.settings.leader_wait if wait is None else None
        return await retry_rule(what, attempt, transient=transient, budget=budget,
                                deadline=deadline if wait is None else Deadline(wait), before_retry=before_retry,
                                advice=f"{advice}; {QUORUM_ADVICE}" if advice else QUORUM_ADVICE, logger=logger)

    async def round_trip(self) -> None:
        """One PING/PONG within ``request_timeout``, ignoring a timeout (before a retry: what was sent is read)."""
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            await self.nc.flush(timeout=self.settings.request_timeout)  # type: ignore[arg-type]  # float s work

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
                await self.round_trip()
        finally:
            await self.nc.close()


async def connect(settings: ConnectionSettings, **options: Any) -> JetStreamConnection:
    """Open a connection; raises a typed :class:`ConnectionFailedError` subclass on failure, and
    :class:`~airflow_jetstream.client.errors.NatsPyVersionError` on a nats-py whose internals this toolkit uses
    changed (client/natspy_internals.py)."""
    await check_natspy()
    if settings.nkey_seed_secret or settings.creds_file:
        _require_nkeys()
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
        if typed is None and len(last_error) >= len(settings.servers) and all(map(_refused, last_error)):
            typed = _unreachable(settings, last_error, refused=True)
        if typed is not None and not fatal.done():
            fatal.set_result(typed)

    kwargs = with_pending_size(nc, {**settings.connect_options(), "max_reconnect_attempts": 60,
                                    "reconnect_time_wait": 0.5, "ping_interval": PING_INTERVAL,
                                    "max_outstanding_pings": MAX_OUTSTANDING_PINGS, **options, "error_cb": error_cb})
    install_pong_guard(nc)  # before connecting: a stall can come at any time
    budget = settings.connect_timeout * max(1, len(settings.servers)) + 1.0
    task = asyncio.ensure_future(nc.connect(**kwargs))
    try:
        done, _ = await asyncio.wait({task, cast("asyncio.Future[Any]", fatal)}, timeout=budget,
                                     return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the caller gave up: no connect may go on and open a connection nobody owns
        await _abandon(nc, task, fatal)
        raise
    if task in done and task.exception() is None:
        fatal.cancel()
        try:
            check_connected(nc)
        except NatsPyVersionError:
            await nc.close()
            raise
        conn = JetStreamConnection(nc, settings)
        holder["conn"] = conn
        return conn
    error: JetStreamError
    if fatal.done() and not fatal.cancelled():
        error = fatal.result()
    elif task.done() and (exc := task.exception()) is not None:
        error = _classify_connect_error(exc) or _unreachable(settings, last_error or [exc])
    else:
        error = _unreachable(settings, last_error)
    await _abandon(nc, task, fatal)
    raise error


async def _abandon(nc: NATS, task: asyncio.Future[Any], fatal: asyncio.Future[JetStreamError]) -> None:
    """Stop a connect that failed or whose caller gave up, and close what it opened."""
    task.cancel()
    fatal.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # nats-py asserts "Client.connect must be called first" when the connect failed before it began (an invalid
    # nkey seed): there is nothing to close, and the typed error must not be hidden behind that assertion
    with contextlib.suppress(AssertionError):
        await nc.close()


def _require_nkeys() -> None:
    """nats-py imports ``nkeys`` (with PyNaCl, compiled code) for nkey and creds authentication only, mid-connect;
    missing, it surfaced as nats-py's AssertionError from closing the half-made client."""
    try:
        importlib.import_module("nkeys")
    except ImportError:
        raise ConnectionFailedError(
            "nkey and creds authentication need the nkeys package (with PyNaCl) in this Python, which lacks it: "
            "pip install nkeys (Spark executors: docs/spark.md, Shipping the package to executors)",
            reason="nkeys_not_installed",
        ) from None


def _refused(exc: BaseException) -> bool:
    """Nothing listens there: the address answered the TCP connect with a refusal."""
    return isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and "[Errno 111]" in str(exc))


def _unreachable(settings: ConnectionSettings, errors: list[BaseException], *,
                 refused: bool = False) -> ConnectionFailedError:
    """No server reached: every one ``refused`` the TCP connection (failing at once instead of waiting the connect
    timeout), or none answered within it."""
    seen = f" (last error: {type(errors[-1]).__name__})" if errors else ""
    why = ("every server refused the connection (nothing listens at that host and port)" if refused
           else f"within {settings.connect_timeout}s per server{seen}")
    return ConnectionFailedError(f"could not connect to NATS at {', '.join(settings.servers)}{':' if refused else ''} "
                                 f"{why}; check that the server runs and the connection's host/port are right")


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


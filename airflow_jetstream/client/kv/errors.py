"""One mapping of nats-py KV/JetStream exceptions to the toolkit's typed errors, for every KV call
(the KV operators and sensors, the batch ledger, the Spark writer's job records).

nats-py sends KV calls itself (``$KV.<bucket>.<key>`` publishes, ``$JS.API...KV_<bucket>`` requests), so
a permissions violation reaches the toolkit only as the server's asynchronous ``-ERR``. While a call
runs, such a refusal of one of the bucket's subjects ends it at once with ``permission_denied`` naming
the subject, instead of a timeout after ``request_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import nats.errors
import nats.js.errors

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import BucketNotFoundError, JetStreamError, PermissionDeniedError, error_from_api


def bucket_missing(context: str) -> JetStreamError:
    """The KV API's error for a bucket that does not exist."""
    return BucketNotFoundError(f"{context}: the bucket does not exist; create it first (the KV operator ensures it, "
                               "or ensure_bucket)")


def _concerns(subject: str, bucket: str) -> bool:
    """Whether ``subject`` (lowercased by nats-py) is one of ``bucket``'s KV or stream API subjects."""
    subject, bucket = subject.lower(), bucket.lower()
    return subject.startswith(f"$kv.{bucket}.") or subject.endswith(f".kv_{bucket}") or f".kv_{bucket}." in subject


def _original_case(conn: JetStreamConnection, subject: str, bucket: str) -> str:
    """The refused subject with the API prefix, API verbs and bucket spelled as sent (nats-py lowercases the
    -ERR text; a key keeps the server's lowercase)."""
    prefix = conn.api_prefix
    if subject.lower().startswith(prefix.lower() + "."):
        tokens = subject[len(prefix) + 1:].split(".")
        verbs = next((i for i, t in enumerate(tokens) if t.lower() == f"kv_{bucket.lower()}"), 0)
        subject = ".".join([prefix, *(t.upper() for t in tokens[:verbs]), *tokens[verbs:]])
    for lower, original in ((f"$kv.{bucket.lower()}.", f"$KV.{bucket}."), (f"kv_{bucket.lower()}", f"KV_{bucket}")):
        at = subject.lower().find(lower)
        if at >= 0:
            subject = subject[:at] + original + subject[at + len(lower):]
    return subject


def _denied(conn: JetStreamConnection, subject: str, bucket: str) -> PermissionDeniedError:
    shown = _original_case(conn, subject, bucket)
    return PermissionDeniedError(
        f"permission denied: this NATS user may not use {shown!r} (KV bucket {bucket!r}); grant it in the "
        "server's authorization config or use another user", subject=shown)


@asynccontextmanager
async def kv_errors(conn: JetStreamConnection, bucket: str, context: str, *,
                    missing: Callable[[str], JetStreamError] = bucket_missing,
                    keep: tuple[type[BaseException], ...] = (), fail_fast: bool = True) -> AsyncIterator[None]:
    """Turn nats-py exceptions raised by KV calls on ``bucket`` into typed errors naming ``context``.

    A missing bucket is ``missing(context)``; ``keep`` are nats-py exceptions the caller handles itself.
    No answer is, on a cluster, :class:`LeaderUnavailableError` (retried by callers), else a timeout.
    ``fail_fast`` cancels the body on a refusal: turn it off around a ``yield`` (the body's task runs the
    caller's code there), where the toolkit's own requests fail fast anyway.
    """
    task = asyncio.current_task() if fail_fast else None
    refused: list[str] = []

    def on_denied(subject: str) -> None:
        if task is not None and not refused and _concerns(subject, bucket):
            refused.append(subject)
            task.cancel()

    conn.denial_listeners.append(on_denied)
    try:
        yield
    except BaseException as exc:
        if refused:
            if isinstance(exc, asyncio.CancelledError) and task is not None and task.uncancel() > 0:
                raise  # cancelled from outside as well
            conn.take_violation(refused[0].__eq__)  # reported here, so no later failure reads it as its own
            raise _denied(conn, refused[0], bucket) from None
        if isinstance(exc, (JetStreamError, *keep)) or not isinstance(exc, nats.errors.Error):
            raise
        raise await _typed(conn, bucket, context, exc, missing) from None
    finally:
        conn.denial_listeners.remove(on_denied)


async def _typed(conn: JetStreamConnection, bucket: str, context: str, exc: nats.errors.Error,
                 missing: Callable[[str], JetStreamError]) -> JetStreamError:
    if isinstance(exc, nats.js.errors.BucketNotFoundError):
        return missing(context)
    if isinstance(exc, nats.js.errors.APIError):
        # nats-py's APIError subclasses (KeyNotFoundError, ...) may leave code/err_code/description unset
        return error_from_api({"code": getattr(exc, "code", None), "err_code": getattr(exc, "err_code", None),
                               "description": getattr(exc, "description", None) or str(exc)}, context=context)
    if isinstance(exc, (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                        nats.js.errors.NoStreamResponseError)):
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            await conn.nc.flush(timeout=conn.settings.request_timeout)  # type: ignore[arg-type]  # float s work  # a late -ERR is read before this returns
        taken = conn.take_violation(lambda subject: _concerns(subject, bucket))
        if taken is not None:
            return _denied(conn, taken[1], bucket)
        return conn.unanswered(f"{context}: JetStream did not answer within {conn.settings.request_timeout:g}s; "
                               "check that JetStream runs and the bucket exists")
    return JetStreamError(f"{context}: {type(exc).__name__}: {exc}")

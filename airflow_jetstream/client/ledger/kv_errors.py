"""The batch ledger's KV calls: nats-py KV/JetStream exceptions turned into the toolkit's typed errors."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats.errors
import nats.js.errors

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import JetStreamError, LedgerNotFoundError, error_from_api


@asynccontextmanager
async def kv_errors(conn: JetStreamConnection, context: str) -> AsyncIterator[None]:
    """Turn nats-py KV/JetStream exceptions into the toolkit's typed errors, naming ``context``."""
    try:
        yield
    except JetStreamError:
        raise
    except nats.js.errors.BucketNotFoundError:
        raise LedgerNotFoundError(f"{context}: the ledger bucket does not exist; open it with create=True") from None
    except nats.js.errors.APIError as exc:
        raise error_from_api(
            {"code": exc.code, "err_code": exc.err_code, "description": exc.description}, context=context
        ) from None
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError):
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            await conn.nc.flush(timeout=conn.settings.request_timeout)
        for _op, subject in conn.permission_violations:
            denied = conn.permission_error(subject)
            if denied:
                raise denied from None
        # as for API calls: an election (retried) only on a cluster; on a single server a slow answer
        raise conn.unanswered(
            f"{context}: JetStream did not answer within {conn.settings.request_timeout:g}s; check that "
            "JetStream runs and the KV bucket exists"
        ) from None
    except nats.errors.Error as exc:
        raise JetStreamError(f"{context}: {type(exc).__name__}: {exc}") from None

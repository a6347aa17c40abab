"""The batch ledger's KV calls: the KV wing's one error mapping (:mod:`airflow_jetstream.client.kv.errors`,
permission refusals fail fast naming the subject), with a missing bucket reported as the ledger's."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import LedgerNotFoundError
from airflow_jetstream.client.kv import errors


def ledger_missing(context: str) -> LedgerNotFoundError:
    return LedgerNotFoundError(f"{context}: the ledger bucket does not exist; open it with create=True")


def kv_errors(conn: JetStreamConnection, bucket: str, context: str, *,
              fail_fast: bool = True) -> AbstractAsyncContextManager[None]:
    """Typed errors for the ledger's KV calls on ``bucket``, naming ``context`` (``fail_fast``: as in
    :func:`~airflow_jetstream.client.kv.errors.kv_errors`)."""
    return errors.kv_errors(conn, bucket, context, missing=ledger_missing, fail_fast=fail_fast)

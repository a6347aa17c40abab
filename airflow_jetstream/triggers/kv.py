"""JetStreamKeyValueTrigger: watch a KV key in the triggerer until it exists, equals a value or satisfies a function."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_jetstream.client.kv.condition import KeyCondition
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.triggers.base import retrying
from airflow_jetstream.triggers.deadline import within


class JetStreamKeyValueTrigger(BaseTrigger):
    """Fire when ``key`` of ``bucket`` satisfies the condition (see :class:`KeyCondition`), watched with a
    KV watch (the current value first, then each change). ``apply_function`` is a dotted path and runs
    on the triggerer's event loop. All triggers of one connection id share one NATS connection per
    triggerer event loop.

    Events: ``{"status": "matched", "entry": {...}}``, ``{"status": "error", "error": {...}}`` or, once
    ``timeout_at`` (ISO time) passed, ``{"status": "timeout"}``.
    """

    def __init__(self, *, bucket: str, key: str, value: Any = None, apply_function: str | None = None,
                 apply_function_args: Sequence[Any] | None = None, apply_function_kwargs: dict[str, Any] | None = None,
                 nats_conn_id: str = JetStreamHook.default_conn_name, timeout_at: str | None = None) -> None:
        super().__init__()
        self.timeout_at = timeout_at
        self.bucket = bucket
        self.key = key
        self.value = value
        self.apply_function = apply_function
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.nats_conn_id = nats_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "bucket": self.bucket, "key": self.key, "value": self.value, "apply_function": self.apply_function,
            "apply_function_args": self.apply_function_args, "apply_function_kwargs": self.apply_function_kwargs,
            "nats_conn_id": self.nats_conn_id, "timeout_at": self.timeout_at,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(await within(self.timeout_at, self._wait()))

    async def _wait(self) -> dict[str, Any]:
        return await retrying(self.log, "KV watch", self._watch)

    async def _watch(self) -> dict[str, Any]:
        from airflow_jetstream.client.connection_pool import shared_connection
        from airflow_jetstream.client.kv.watch import wait_for_key

        condition = KeyCondition(value=self.value, apply_function=self.apply_function,
                                 apply_function_args=self.apply_function_args,
                                 apply_function_kwargs=self.apply_function_kwargs)
        settings = await JetStreamHook(nats_conn_id=self.nats_conn_id).aget_settings()
        self.log.info("Watching KV key %s in bucket %s until it %s", self.key, self.bucket, condition.describe())
        async with shared_connection(settings) as conn:
            entry = await wait_for_key(conn, self.bucket, self.key, condition)
        return {"status": "matched", "entry": entry}

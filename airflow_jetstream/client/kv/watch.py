"""Wait until a KV key exists, equals a value, or satisfies a function (a KV watch: no polling)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.kv.bucket import open_bucket
from airflow_jetstream.client.kv.errors import kv_errors
from airflow_jetstream.client.kv.keys import entry_dict, get_key, validate_key
from airflow_jetstream.client.reading.apply_function import FunctionSpec, bind_function, call_function

_REMOVED = ("DEL", "PURGE")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyCondition:
    """What the key must hold: with ``apply_function``, whatever makes ``apply_function(entry)`` truthy
    (``entry`` is the JSON-able dict of the value); else with ``value``, that value (a str compared with
    the text, anything else with the parsed JSON); else merely that the key exists."""

    value: Any = None
    apply_function: FunctionSpec | None = None
    apply_function_args: Sequence[Any] = ()
    apply_function_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.apply_function is not None and self.value is not None:
            raise InvalidRequestError("give value or apply_function, not both (compare with the value inside the "
                                      "function if both matter)", reason="invalid_option")
        if self.apply_function is not None:  # fail early on a bad function
            bind_function(self.apply_function, self.apply_function_args, self.apply_function_kwargs)

    @property
    def expect(self) -> str:
        return "function" if self.apply_function is not None else "equals" if self.value is not None else "exists"

    def describe(self) -> str:
        if self.expect == "function":
            name = self.apply_function if isinstance(self.apply_function, str) else \
                getattr(self.apply_function, "__name__", "apply_function")
            return f"satisfies {name}"
        return f"equals {self.value!r}" if self.expect == "equals" else "exists"

    async def holds(self, entry: dict[str, Any]) -> Any:
        """Truthy when ``entry`` satisfies the condition (the function's own result in function mode)."""
        if self.expect == "function":
            func = bind_function(cast(FunctionSpec, self.apply_function), self.apply_function_args,
                                 self.apply_function_kwargs)
            return await call_function(func, entry)
        if self.expect == "equals":
            if isinstance(self.value, (bytes, bytearray)):
                return entry["encoding"] == "utf-8" and entry["value"].encode() == bytes(self.value)
            if isinstance(self.value, str):
                return entry["encoding"] == "utf-8" and entry["value"] == self.value
            return "json" in entry and entry["json"] == self.value
        return True


def _matched(entry: dict[str, Any], result: Any) -> dict[str, Any]:
    if isinstance(result, bool) or result is None:
        return entry
    try:
        json.dumps(result)
    except (TypeError, ValueError):
        result = repr(result)
    return {**entry, "result": result}


async def check_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any] | None:
    """The key's entry when it satisfies ``condition`` now, else None."""
    entry = await get_key(conn, bucket, key)
    if entry is None:
        return None
    result = await condition.holds(entry)
    return _matched(entry, result) if result else None


async def wait_for_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any]:
    """Watch ``key`` (its current value first, then every change) until ``condition`` holds; return the entry.

    A deleted or purged key does not exist. Cancel the task to stop waiting.
    """
    validate_key(key)
    kv = await open_bucket(conn, bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r} key {key!r}"):
        watcher = await kv.watch(key)
    try:
        async for update in watcher:
            if update is None or update.operation in _REMOVED:
                continue  # "initial values done" marker, or the key was removed
            entry = entry_dict(bucket, update.key, update.revision, update.value, operation=update.operation,
                               created=update.created)
            result = await condition.holds(entry)
            if result:
                return _matched(entry, result)
            log.info("KV %s/%s at revision %d does not %s yet", bucket, key, update.revision, condition.describe())
    finally:
        if not conn.nc.is_closed:
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py leaves it unannotated
    raise AssertionError("unreachable: a KV watch ends only when stopped")

"""JetStreamKeyValueTrigger: a KV key exists, equals a value or satisfies a function (waited for in the triggerer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.kv.names import KeyCondition
from airflow_jetstream.triggers.base import JetStreamResultTrigger

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection
    from airflow_jetstream.client.reading.apply_function import FunctionSpec


class JetStreamKeyValueTrigger(JetStreamResultTrigger):
    """Fire when ``key`` of ``bucket`` satisfies the condition (:class:`KeyCondition`): its current value first,
    then each change, through the one subscription the triggerer process shares per bucket.

    ``apply_function`` is a dotted path (a callable only for a sensor's poke, never serialized) and runs on the
    triggerer's event loop. Events: ``matched`` (with ``entry``), ``error`` or ``timeout``.
    """

    what = "a KV key"
    serialized = ("bucket", "key", "value", "apply_function", "apply_function_args", "apply_function_kwargs")

    def __init__(self, *, bucket: str, key: str, value: Any = None, apply_function: FunctionSpec | None = None,
                 apply_function_args: Sequence[Any] | None = None, apply_function_kwargs: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bucket = bucket
        self.key = key
        self.value = value
        self.apply_function = apply_function
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.last_seen = f"KV {bucket}/{key} not read yet"

    def condition(self) -> KeyCondition:
        """The condition (built when the trigger runs: a bad function is the trigger's error event, not the
        triggerer's when it rebuilds the trigger)."""
        return KeyCondition(value=self.value, apply_function=self.apply_function,
                            apply_function_args=self.apply_function_args,
                            apply_function_kwargs=self.apply_function_kwargs)

    def goal(self) -> str:
        if self.apply_function is not None:
            return f"KV {self.bucket}/{self.key} to satisfy {self.apply_function}"
        return f"KV {self.bucket}/{self.key} to {'equal ' + repr(self.value) if self.value is not None else 'exist'}"

    def result(self, event: dict[str, Any]) -> dict[str, Any] | None:
        return event["entry"] if event.get("status") == "matched" else None

    def done_line(self, result: dict[str, Any]) -> str:
        return f"Done: KV {self.bucket}/{self.key} matched at revision {result['revision']}"

    async def check(self, conn: JetStreamConnection) -> dict[str, Any] | None:
        from airflow_jetstream.client.kv.keys import check_key

        condition = self.condition()
        entry = await check_key(conn, self.bucket, self.key, condition)
        answer = f"yes (revision {entry['revision']})" if entry else "not yet"
        self.last_seen = f"KV {self.bucket}/{self.key} {condition.describe()}: {answer}"
        return {"status": "matched", "entry": entry} if entry else None

    async def wait(self, conn: JetStreamConnection) -> dict[str, Any]:
        from airflow_jetstream.client.kv.keys import wait_for_key

        condition = self.condition()
        self.log.info("Watching KV key %s in bucket %s until it %s", self.key, self.bucket, condition.describe())
        self.last_seen = f"KV {self.bucket}/{self.key} {condition.describe()}: not yet"
        return {"status": "matched", "entry": await wait_for_key(conn, self.bucket, self.key, condition)}

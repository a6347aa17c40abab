"""JetStreamKeyValueSensor: wait until a KV key exists, equals a value, or satisfies a function."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow_jetstream.client.kv.condition import KeyCondition
from airflow_jetstream.client.kv.names import check_bucket, validate_key
from airflow_jetstream.client.reading.apply_function import function_path
from airflow_jetstream.sensors.base import JetStreamBaseSensor, failure
from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger


class JetStreamKeyValueSensor(JetStreamBaseSensor):
    """Wait until ``key`` of the KV ``bucket`` exists, equals ``value``, or satisfies ``apply_function``.

    A signal between systems ("model v42 is ready"): poke mode reads the key's current value each
    poke; deferred, the trigger watches the key (a KV watch: no polling) and fires on the first
    value that matches. A deleted or purged key does not exist. ``value``: a ``str`` is compared with
    the value's text, anything else (dict, list, number, bool) with the value parsed as JSON.
    ``apply_function(entry, *args, **kwargs)`` gets the entry dict and matches when truthy.

    Returns (XCom ``return_value``) the entry ``{"bucket", "key", "revision", "value", "encoding",
    "json" (when the value is JSON), "operation", "created"}`` plus ``result`` when the function
    returned something other than ``True``::

        model_ready = JetStreamKeyValueSensor(
            task_id="model_ready",
            bucket="models",
            key="churn.status",
            value="ready",
            deferrable=True,
        )

    :param bucket: the bucket (templated); it must exist.
    :param key: the key (templated).
    :param value: the value to wait for (templated); None waits for the key to exist.
    :param apply_function: instead, a predicate: callable or dotted path (deferrable mode needs a
        module-level function, stored by its dotted path).
    :param apply_function_args, apply_function_kwargs: extra arguments (templated).
    :param deferrable: wait in the triggerer; default ``[operators] default_deferrable``.
    :param nats_conn_id: the ``nats`` connection to use (templated).
    """

    template_fields: Sequence[str] = ("bucket", "key", "value", "apply_function_args", "apply_function_kwargs",
                                      "nats_conn_id")

    def __init__(
        self,
        *,
        bucket: str,
        key: str,
        value: Any = None,
        apply_function: Callable[..., Any] | str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if "{{" not in str(bucket):
            check_bucket(bucket)
        if "{{" not in str(key):
            validate_key(key)
        if apply_function is not None and self.deferrable:
            apply_function = function_path(apply_function)
        self.bucket = bucket
        self.key = key
        self.value = value
        self.apply_function = apply_function
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self.condition()  # a bad function fails when the DAG is parsed

    def condition(self) -> KeyCondition:
        return self.make_trigger(None).condition()

    def make_trigger(self, context: Any) -> JetStreamKeyValueTrigger:
        return JetStreamKeyValueTrigger(bucket=self.bucket, key=self.key, value=self.value,
                                        apply_function=self.apply_function,
                                        apply_function_args=self.apply_function_args,
                                        apply_function_kwargs=self.apply_function_kwargs,
                                        nats_conn_id=self.nats_conn_id)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "matched":
            entry: dict[str, Any] = event["entry"]
            self.log.info("KV %s/%s matched at revision %s", self.bucket, self.key, entry["revision"])
            return entry
        if event.get("status") == "timeout":
            self.timed_out(f"KV {self.bucket}/{self.key} did not {self.condition().describe()}")
        raise failure(f"KV {self.bucket}/{self.key}", event.get("error") or event)

"""JetStreamKeyValueSensor: wait until a KV key exists, equals a value, or satisfies a function."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow_jetstream.client.kv.names import check_bucket, validate_key
from airflow_jetstream.client.reading.apply_function import function_path
from airflow_jetstream.sensors.base import JetStreamStateSensor
from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger


class JetStreamKeyValueSensor(JetStreamStateSensor):
    """Wait until ``key`` of the KV ``bucket`` exists, equals ``value``, or satisfies ``apply_function``.

    A signal between systems ("model v42 is ready"): a poke reads the key's current value; deferred, the
    trigger watches the key (no polling). A deleted or purged key does not exist. A ``str`` value is compared
    with the value's text, anything else with the value parsed as JSON; ``apply_function(entry, ...)`` matches
    when truthy (deferred: a module-level function, stored by its dotted path). ``start_from_trigger=True``: the
    scheduler defers the task itself, and ``end_from_trigger=True`` lets the trigger end it with its XCom, as for the
    state sensors (:class:`~.base.JetStreamStateSensor`). Returns the entry
    (``bucket``, ``key``, ``revision``, ``value``, ...) plus ``result`` when the function returned other than
    ``True``; see docs/sensors/kv.md.
    """

    template_fields: Sequence[str] = ("bucket", "key", "value", "apply_function_args", "apply_function_kwargs")
    trigger_class = JetStreamKeyValueTrigger
    defer_backstop = 0  # Airflow's deferral timeout is ``timeout`` itself, as for the message sensor

    def __init__(self, *, bucket: str, key: str, value: Any = None,
                 apply_function: Callable[..., Any] | str | None = None,
                 apply_function_args: Sequence[Any] | None = None, apply_function_kwargs: dict[str, Any] | None = None,
                 start_from_trigger: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if "{{" not in str(bucket):
            check_bucket(bucket)
        if "{{" not in str(key):
            validate_key(key)
        if apply_function is not None and (self.deferrable or start_from_trigger):
            apply_function = function_path(apply_function)
        self.bucket = bucket
        self.key = key
        self.value = value
        self.apply_function = apply_function
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        JetStreamKeyValueTrigger(**self._trigger_args()).condition()  # a bad function fails when the DAG is parsed
        if start_from_trigger:
            self.start_in_triggerer(self.make_trigger(None))

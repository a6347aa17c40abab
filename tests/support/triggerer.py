"""Run triggers the way Airflow's triggerer does: serialized, kwargs stored and read back (Trigger.encrypt_kwargs,
_decrypt_kwargs, smart_decode_trigger_kwargs), the class imported from its classpath, ``run()`` on one event loop."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow._shared.module_loading import import_string
from airflow.models.trigger import Trigger
from airflow.serialization.decoders import smart_decode_trigger_kwargs
from airflow.triggers.base import BaseTrigger


def rebuilt(trigger: BaseTrigger) -> BaseTrigger:
    """A new trigger from ``trigger.serialize()``, as the triggerer builds it from the database row."""
    classpath, kwargs = trigger.serialize()
    stored = Trigger._decrypt_kwargs(Trigger.encrypt_kwargs(kwargs))
    return import_string(classpath)(**{key: smart_decode_trigger_kwargs(value) for key, value in stored.items()})


def start(triggers: list[BaseTrigger]) -> list[asyncio.Task[Any]]:
    """One task per rebuilt trigger, each ending with its first event's payload (call on the running loop)."""

    async def first_event(trigger: BaseTrigger) -> dict[str, Any]:
        events = trigger.run()
        try:
            return (await anext(events)).payload
        finally:
            await events.aclose()

    return [asyncio.ensure_future(first_event(rebuilt(trigger))) for trigger in triggers]

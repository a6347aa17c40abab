"""Process each JetStream message of an event-driven DAG once, by its stream sequence.

A watcher (:class:`~airflow_jetstream.triggers.message.JetStreamMessageTrigger`) turns each message
into an asset event. Two things make a task see a message other than exactly once:

* a repeat: a triggerer crash after Airflow stored an event and before the message was acked
  gives a second event for the same ``stream_seq`` (``delivered`` 2 or more);
* a stranded event: Airflow 3.3 can store an event without starting a run for it until the next
  event arrives (docs/event-driven.md, "Stranded events").

:func:`asset_messages` collects this run's messages plus those stored since its first event and
:func:`process_each_once` claims each ``stream_seq`` in a KV bucket before calling ``work``::

    @task(inlets=[orders_ready])
    def process(triggering_asset_events=None, inlet_events=None):
        messages = asset_messages(orders_ready, triggering_asset_events, inlet_events)
        return process_each_once(messages, handle_order, bucket="orders_ready_processed")
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from airflow_jetstream.client.errors import KeyRevisionError
from airflow_jetstream.hooks.jetstream import JetStreamHook

log = logging.getLogger(__name__)
__all__ = ["asset_messages", "process_each_once"]
#: The most stored events one run looks at beyond its own (the oldest first).
STRANDED_LIMIT = 1000


def _message(event: Any) -> dict[str, Any] | None:
    payload = (event.extra or {}).get("payload")
    return payload if isinstance(payload, dict) and "stream_seq" in payload else None


def asset_messages(asset: Any, triggering_asset_events: Mapping[Any, Any] | None,
                   inlet_events: Mapping[Any, Any] | None = None, *,
                   limit: int = STRANDED_LIMIT) -> list[dict[str, Any]]:
    """The message payloads of this run's events of ``asset`` and of those stored after its first one.

    With ``inlet_events`` (the task declares ``inlets=[asset]``), events Airflow stored after this run's
    first event are included too: an event that got no run of its own (stranded) is stored before the
    run that left it behind starts, so that run processes it. At most ``limit`` more events are read.
    Ordered by stream sequence, one entry per stream sequence (the first delivery seen).
    """
    own = list((triggering_asset_events or {}).get(asset, []))
    events = list(own)
    if inlet_events is not None and own:
        first = min(event.timestamp for event in own)
        events += list(inlet_events[asset].after(first.isoformat()).ascending().limit(limit))
    messages: dict[tuple[str, int], dict[str, Any]] = {}
    for event in events:
        message = _message(event)
        if message is not None:
            messages.setdefault((message["stream"], message["stream_seq"]), message)
    return [messages[key] for key in sorted(messages, key=lambda k: (k[0], k[1]))]


def process_each_once(messages: Iterable[dict[str, Any]], work: Callable[[dict[str, Any]], Any], *, bucket: str,
                      nats_conn_id: str = JetStreamHook.default_conn_name,
                      ttl: float | str | timedelta = "7d") -> dict[str, list[int]]:
    """Call ``work(message)`` for each message whose stream sequence no run claimed before.

    The claim is the key ``<stream>.<stream_seq>`` created in KV ``bucket`` (created with ``ttl`` when
    missing; keep the ttl longer than a message can take to come back): the first run to create it
    processes the message, any later one logs it and skips it. When ``work`` raises, the claim is deleted
    again before the error propagates, so a retry processes the message. Returns JSON-able
    ``{"processed": [...], "repeated": [...]}`` (stream sequences).
    """
    pending = list(messages)

    async def claim_and_work(conn: Any) -> dict[str, list[int]]:
        from airflow_jetstream.client.kv import create_key, delete_key, ensure_bucket

        await ensure_bucket(conn, bucket, ttl=ttl)
        done: dict[str, list[int]] = {"processed": [], "repeated": []}
        for message in pending:
            seq, key = message["stream_seq"], f"{message['stream']}.{message['stream_seq']}"
            try:
                await create_key(conn, bucket, key, {"subject": message["subject"],
                                                     "delivered": message.get("delivered")})
            except KeyRevisionError:
                log.info("Message %s of %s was already processed (delivered %sx): skipped", seq, message["stream"],
                         message.get("delivered"))
                done["repeated"].append(seq)
                continue
            try:
                work(message)
            except BaseException:
                await delete_key(conn, bucket, key)
                raise
            done["processed"].append(seq)
        return done

    return JetStreamHook(nats_conn_id=nats_conn_id).run(claim_and_work)

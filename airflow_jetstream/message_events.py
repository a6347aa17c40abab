"""Process each JetStream message of an event-driven DAG once, by its stream sequence (docs/event-driven.md).

A watcher turns each message into an asset event. A task can see a message other than exactly once: a
triggerer crash after Airflow stored an event and before the message was acked repeats it (``delivered``
2+), and Airflow 3.3 can store an event without starting a run for it until the next event arrives (a
stranded event). :func:`asset_messages` collects this run's messages plus those stored since its first
event, and :func:`process_each_once` claims each ``stream_seq`` in a KV bucket before calling ``work``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from airflow_jetstream.hooks.jetstream import JetStreamHook

log = logging.getLogger(__name__)
__all__ = ["asset_messages", "process_each_once"]
#: The most stored events one run looks at beyond its own (the oldest first).
STRANDED_LIMIT = 1000


def asset_messages(asset: Any, triggering_asset_events: Mapping[Any, Any] | None,
                   inlet_events: Mapping[Any, Any] | None = None, *, limit: int = STRANDED_LIMIT,
                   nats_conn_id: str = JetStreamHook.default_conn_name) -> list[dict[str, Any]]:
    """The message payloads of this run's events of ``asset`` and of those stored after its first one.

    An event carries only where its message is (the watcher's default, so that no body reaches the triggerer's
    log or the asset event); the body and headers are read back here from the stream (``nats_conn_id``), one
    request per message, into the payload the watcher saw (``json`` or ``data``, ``encoding``, ``headers``).

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
        payload = (event.extra or {}).get("payload")
        if isinstance(payload, dict) and "stream_seq" in payload:
            messages.setdefault((payload["stream"], payload["stream_seq"]), payload)
    ordered = [messages[key] for key in sorted(messages)]
    if all(map(_has_body, ordered)):
        return ordered
    return JetStreamHook(nats_conn_id=nats_conn_id).run(_read_back, ordered)


def _has_body(payload: dict[str, Any]) -> bool:
    """The event carried the body (``body_in_event``) or an advisory watcher's parsed advisory."""
    return any(key in payload for key in ("json", "data", "advisory"))


async def _read_back(conn: Any, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``payloads`` with the body and headers of each reference read from its stream (by ``stream_seq``)."""
    from airflow_jetstream.client.errors import JetStreamError
    from airflow_jetstream.client.reading.headers import headers_json
    from airflow_jetstream.client.reading.messages import body_fields
    from airflow_jetstream.client.reading.stored import get_message

    complete = []
    for payload in payloads:
        if _has_body(payload):
            complete.append(payload)
            continue
        stream, seq = payload["stream"], payload["stream_seq"]
        stored = await get_message(conn, stream, seq=seq)
        if stored is None:
            raise JetStreamError(
                f"message {seq} of stream {stream!r} (an asset event's) is no longer stored when the task reads it "
                "(a workqueue or interest stream removes it once the watcher acks, max_age once it is old): use a "
                "limits stream whose max_age outlasts the runs, or the watcher's body_in_event=True",
                reason="message_gone")
        where = f"stream {stream!r} at sequence {seq}"
        complete.append({**payload, "headers": headers_json(stored.headers),
                         **body_fields(stored.data, where=where, limit=len(stored.data))})
    return complete


def process_each_once(messages: Iterable[dict[str, Any]], work: Callable[[dict[str, Any]], Any], *, bucket: str,
                      nats_conn_id: str = JetStreamHook.default_conn_name,
                      ttl: float | str | timedelta = "7d", max_bytes: int | None = None) -> dict[str, list[int]]:
    """Call ``work(message)`` for each message whose stream sequence no run claimed before.

    The claim is the key ``<stream>.<stream_seq>`` created in KV ``bucket`` (one round trip per message): the
    first run to create it processes the message, any later one logs it and skips it. When ``work`` raises,
    the claim is deleted again before the error propagates, so a retry processes the message. Returns
    JSON-able ``{"processed": [...], "repeated": [...]}`` (stream sequences).

    ``work`` gets the message with ``claim_revision``: the KV revision of this run's claim, a token that is
    higher for any later claim of the message (after the claim's ``ttl``). Store it with the output and let
    readers take the highest one, so a run frozen past the ttl whose message was claimed again cannot
    replace the later run's output (docs/ledger.md, "Fencing outputs").

    The bucket keeps a claim ``ttl`` after it was made (and, with ``max_bytes``, at most that many bytes of
    claims; a full bucket refuses new claims): keep the ttl longer than a message can take to come back, since a
    message whose claim expired is processed again. The bucket is created with these, or changed to them.
    """
    pending = list(messages)

    async def claim_and_work(conn: Any) -> dict[str, list[int]]:
        from airflow_jetstream.client.kv.keys import claim, open_claims, release

        kept = await open_claims(conn, bucket, ttl=ttl, max_bytes=max_bytes)
        log.info("Claims bucket %s keeps a claim %s%s", bucket,
                 f"{kept['ttl'] / 86400:g} d" if kept.get("ttl") else "forever",
                 f", at most {max_bytes} bytes of claims" if max_bytes else "")
        done: dict[str, list[int]] = {"processed": [], "repeated": []}
        for message in pending:
            seq, key = message["stream_seq"], f"{message['stream']}.{message['stream_seq']}"
            revision = await claim(conn, bucket, key, {"subject": message["subject"],
                                                       "delivered": message.get("delivered")})
            if revision is None:
                log.info("Message %s of %s was already processed (delivered %sx): skipped", seq, message["stream"],
                         message.get("delivered"))
                done["repeated"].append(seq)
                continue
            try:
                work({**message, "claim_revision": revision})
            except BaseException:
                await release(conn, bucket, key, revision)
                raise
            done["processed"].append(seq)
        return done

    return JetStreamHook(nats_conn_id=nats_conn_id).run(claim_and_work)

"""Wait until a KV key exists, equals a value, or satisfies a function: one look now, or until it holds.

Neither creates a consumer of its own. :func:`check_key` reads the key's current value (a direct or message
get). :func:`wait_for_key` reads it once and then follows the bucket through the subscription its process
shares for that bucket (:mod:`~airflow_jetstream.client.reading.shared_tail`): a thousand waiting triggers on
one bucket are one consumer, not a thousand.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import StreamNotFoundError
from airflow_jetstream.client.kv.bucket import bucket_missing
from airflow_jetstream.client.kv.keys import entry_dict, get_key, is_marker
from airflow_jetstream.client.kv.names import KeyCondition, stream_of, validate_key
from airflow_jetstream.client.reading.apply_function import with_result
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.shared_tail import follow
from airflow_jetstream.client.reading.stored import direct_allowed, get_message

log = logging.getLogger(__name__)


async def _holds(condition: KeyCondition, entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The entry (with the function's result) when it exists and satisfies ``condition``, else None."""
    if entry is None:
        return None
    result = await condition.holds(entry)
    return with_result(entry, result) if result else None


def _entry(bucket: str, key: str, message: Message) -> dict[str, Any] | None:
    """A stored KV message as an entry, or None when it removed the key (a marker, as :func:`get_key` reads it)."""
    if is_marker(message.headers):
        return None
    return entry_dict(bucket, key, message.seq, message.data, created=message.time)


async def check_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any] | None:
    """The key's entry when it satisfies ``condition`` now, else None."""
    return await _holds(condition, await get_key(conn, bucket, key))


async def wait_for_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any]:
    """The key's current value first, then each change, until one satisfies ``condition``; return its entry.

    A deleted or purged key does not exist. Cancel the task to stop waiting.
    """
    validate_key(key)
    stream, subject = stream_of(bucket), f"$KV.{bucket}.{key}"
    try:
        async with follow(conn, stream, subject) as listener:
            async with listener.catching_up():
                direct = direct_allowed(conn, await listener.tail.info())
                current = await get_message(conn, stream, subject=subject, direct=direct)
            seen = listener.since
            if current is not None:
                seen = max(seen, current.seq)
                found = await _holds(condition, _entry(bucket, key, current))
                if found is not None:
                    return found
            while True:
                for message in await listener.next_batch():
                    if message.seq <= seen:
                        continue  # the value read first already covered it
                    seen = message.seq
                    found = await _holds(condition, _entry(bucket, key, message))
                    if found is not None:
                        return found
                    log.info("KV %s/%s at revision %d does not %s yet", bucket, key, message.seq, condition.describe())
    except StreamNotFoundError:
        raise bucket_missing(f"KV bucket {bucket!r} key {key!r}") from None

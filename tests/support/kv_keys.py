"""The keys of a KV bucket, read from its stream's subjects in one server answer.

nats-py's ``KeyValue.keys()`` can end its listing before entries already on their way have arrived: its watcher
puts its end marker first (nats-io/nats.py#842), so it returns part of the keys or raises ``NoKeysError`` for a
bucket that has some. A stream info with a subjects filter has no such race.
"""

from __future__ import annotations

from nats.js import JetStreamContext


async def kv_keys(js: JetStreamContext, bucket: str) -> list[str]:
    """Every key of ``bucket`` that has an entry, sorted; a key whose last entry deletes or purges it is included
    (``KeyValue.get`` raises ``KeyDeletedError`` for it)."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
    return sorted(subject[len(prefix):] for subject in info.state.subjects or {})

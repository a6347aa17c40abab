"""A writer of one job, run as its own process so the chaos suite can freeze it: the publish operator's write
path (``publish_chunks``: atomic chunks, msg ids ``<job>-<row>``, chunk n fenced as ``<job>-<n>``, as
``dedupe_key`` does).

``python -m tests.chaos.zombie_writer SERVERS STREAM SUBJECT JOB ROWS CHUNK [--freeze-after-first-chunk]``
publishes rows ``<job>-0`` .. ``<job>-<ROWS-1>`` (payloads keyed like every chaos write) in chunks of ``CHUNK``.
With ``--freeze-after-first-chunk`` the process stops itself (SIGSTOP) once the server has committed the first
chunk and before it sends the second: the freeze lands at that point by construction, not by timing. It prints
one JSON line: the summary, or the error's reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator

from airflow_jetstream.client import BatchMessage, ConnectionSettings, open_connection
from airflow_jetstream.client.batches.publish_chunks import publish_chunks
from airflow_jetstream.client.errors import JetStreamError
from tests.chaos.history import payload


def row_keys(job: str, rows: int) -> list[str]:
    return [f"{job}-{n}" for n in range(rows)]


def chunks(subject: str, keys: list[str], size: int, *, freeze: bool) -> Iterator[list[BatchMessage]]:
    for start in range(0, len(keys), size):
        if freeze and start == size:  # asked for the second chunk: the first one is committed
            os.kill(os.getpid(), signal.SIGSTOP)
        yield [BatchMessage(subject, payload(key), msg_id=key) for key in keys[start:start + size]]


async def write_job(settings: ConnectionSettings, stream: str, subject: str, job: str, keys: list[str], size: int, *,
                    freeze: bool = False) -> dict[str, object]:
    async with open_connection(settings) as conn:
        summary = await publish_chunks(conn, chunks(subject, keys, size, freeze=freeze), stream=stream,
                                       batch_prefix=job, fence_prefix=job)
        return summary.to_dict()


def main() -> None:
    servers, stream, subject, job, rows, size = sys.argv[1:7]
    settings = ConnectionSettings(servers=servers, connect_timeout=2, request_timeout=5)
    try:
        result = asyncio.run(write_job(settings, stream, subject, job, row_keys(job, int(rows)), int(size),
                                       freeze="--freeze-after-first-chunk" in sys.argv[7:]))
    except JetStreamError as exc:
        result = {"error": exc.reason, "message": str(exc)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

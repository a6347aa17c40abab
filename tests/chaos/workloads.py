"""Workloads: each drives the provider's client on its own long-lived connection while the nemesis runs.

Every operation is recorded in the :class:`History` with the keys it wrote (unique payloads) and
what the client reported; nothing here judges, the checker does. Each loop ends when the run is
told to stop or after ``MAX_OPS`` operations, and each operation is bounded by ``op_limit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import psutil

from airflow_jetstream.client import (
    Batcher,
    BatchMessage,
    ConnectionSettings,
    ensure_stream,
    publish_atomic_batch,
    publish_fast_batch,
)
from airflow_jetstream.client.admin.consumers import ensure_consumer, reset_consumer
from airflow_jetstream.client.connection import JetStreamConnection, connect
from airflow_jetstream.client.errors import FastBatchError, JetStreamError
from airflow_jetstream.client.ledger import BatchLedger
from airflow_jetstream.client.sourcing import DurableSource, provision_durable_source
from tests.chaos.history import PROBE_FAILED, History, Op, payload
from tests.chaos.zombie_writer import write_job

log = logging.getLogger(__name__)

MAX_OPS = 5000
ATOMIC, FAST, BATCHED, WORKQUEUE, AGGREGATE, RESET, LEDGER_DATA = "CHA", "CHF", "CHB", "CHW", "CHAGG", "CHR", "CHL"
ZOMBIE = "CHZ"
#: The zombie stream's duplicate window (shortened, as tests do): the frozen writer resumes after it passed.
ZOMBIE_WINDOW = 1.0
ZOMBIE_CHUNK = 5
LEDGER_BUCKET, LEDGER_RUN = "chaos_ledger", "chaos-run"
RESET_CONSUMER, RESET_SIZE = "reader", 30
#: Streams whose replicas must agree after the run (the WorkQueue origin and the reset stream change on reads).
CHECKED_REPLICAS = (ATOMIC, FAST, BATCHED, AGGREGATE, LEDGER_DATA, ZOMBIE)
#: The stream each workload writes: the nemesis kills or cuts off the leaders of the running workloads' streams.
WRITES = {"atomic-ids": ATOMIC, "atomic-noid": ATOMIC, "fast": FAST, "batcher": BATCHED, "batcher-wq": WORKQUEUE,
          "reset": RESET, "ledger": LEDGER_DATA, "zombie-writer": ZOMBIE}


def fault_streams(names: tuple[str, ...]) -> list[str]:
    """The streams of the workloads ``names`` (in a fixed order, so a seed picks the same one)."""
    return sorted({WRITES[name] for name in names})


def _stream(name: str, subject: str, **extra: object) -> dict[str, object]:
    return {"name": name, "subjects": [subject], "num_replicas": 3, "storage": "file", **extra}


STREAMS = [
    _stream(ATOMIC, "cha.>", allow_atomic=True),
    _stream(FAST, "chf.>", allow_batched=True),
    _stream(BATCHED, "chb.>"),
    _stream(WORKQUEUE, "chw.>", retention="workqueue"),
    _stream(RESET, "chr.>"),
    _stream(LEDGER_DATA, "chl.>", allow_atomic=True),
    _stream(ZOMBIE, "chz.>", allow_atomic=True, duplicate_window=ZOMBIE_WINDOW),
]


async def setup(conn: JetStreamConnection) -> None:
    """Create the streams, the durable source, the reset consumer and the ledger bucket (idempotent)."""
    for config in STREAMS:
        await ensure_stream(conn, config)
    await provision_durable_source(conn, DurableSource(AGGREGATE, WORKQUEUE, num_replicas=3))
    info = await conn.js.stream_info(RESET)
    for n in range(info.state.messages, RESET_SIZE):
        await conn.js.publish("chr.x", payload(f"reset-{n}"))
    await ensure_consumer(conn, RESET, {"durable_name": RESET_CONSUMER, "ack_policy": "explicit",
                                        "deliver_policy": "all"})
    await BatchLedger.open(conn, LEDGER_BUCKET, replicas=3)


@dataclass
class Context:
    settings: ConnectionSettings
    history: History
    stop: asyncio.Event
    rng: random.Random
    op_limit: float


async def _bounded(ctx: Context, op: Op, body: Callable[[], Awaitable[None]]) -> None:
    """Run one operation; a typed error is its reported failure, going past ``op_limit`` is ``hung``."""
    try:
        await asyncio.wait_for(body(), ctx.op_limit)
    except TimeoutError:
        op.fail("hung", f"no outcome after {ctx.op_limit:.0f}s")
    except FastBatchError as exc:
        op.fail_with(exc, stored=exc.stored)
    except JetStreamError as exc:
        op.fail_with(exc)
    except Exception as exc:  # an untyped error is a client defect (counted as misleading): outcome unknown
        log.error("%s: untyped error", op.id, exc_info=exc)
        op.fail("untyped", f"{type(exc).__name__}: {exc}")
        op.definite = False


async def _pause(ctx: Context, low: float = 0.02, high: float = 0.15) -> None:
    await asyncio.sleep(ctx.rng.uniform(low, high))


async def _repeat(ctx: Context, name: str, sizes: tuple[int, int] | None,
                  run_op: Callable[[Op], Awaitable[None]], *, pause: tuple[float, float] = (0.02, 0.15)) -> None:
    """Operations of workload ``name``, each writing ``randint(*sizes)`` messages, until the run stops."""
    for _ in range(MAX_OPS):
        if ctx.stop.is_set():
            return
        op = ctx.history.begin(name, ctx.rng.randint(*sizes) if sizes else 0)
        await _bounded(ctx, op, lambda op=op: run_op(op))
        await _pause(ctx, *pause)


def _messages(subject: str, op: Op, *, ids: bool) -> list[BatchMessage]:
    return [BatchMessage(subject, payload(k), msg_id=k if ids else None) for k in op.keys]


async def atomic(ctx: Context, conn: JetStreamConnection, *, ids: bool) -> None:
    name = "atomic-ids" if ids else "atomic-noid"

    async def one(op: Op) -> None:
        result = await publish_atomic_batch(conn, _messages(f"cha.{name}", op, ids=ids), batch_id=op.id)
        op.succeed(**result.to_dict())

    await _repeat(ctx, name, (2, 20), one)


async def fast(ctx: Context, conn: JetStreamConnection) -> None:
    async def one(op: Op) -> None:
        result = await publish_fast_batch(conn, _messages("chf.x", op, ids=True), batch_id=op.id)
        op.succeed(**result.to_dict())

    await _repeat(ctx, "fast", (10, 60), one)


async def batcher(ctx: Context, conn: JetStreamConnection, *, workqueue: bool) -> None:
    """Rounds of 5-20 concurrent single publishes (with msg ids) through one long-lived Batcher."""
    name, subject = ("batcher-wq", "chw.x") if workqueue else ("batcher", "chb.x")
    async with Batcher(conn, fence=False) as coalescer:  # individual publishes; the checker places them
        for _ in range(MAX_OPS):
            if ctx.stop.is_set():
                return
            ops = [ctx.history.begin(name, 1) for _ in range(ctx.rng.randint(5, 20))]

            async def item(op: Op) -> None:
                async def body() -> None:
                    result = await coalescer.publish(subject, payload(op.keys[0]), msg_id=op.keys[0])
                    if result.ok:
                        op.succeed(**result.to_dict())
                    else:
                        op.fail(result.error, result.message)

                await _bounded(ctx, op, body)

            await asyncio.gather(*(item(op) for op in ops))
            await _pause(ctx)


async def consumer_reset(ctx: Context, conn: JetStreamConnection) -> None:
    """Reset the durable to a random sequence and check inline that the next delivery starts there."""
    async def one(op: Op) -> None:
        wanted = ctx.rng.randint(1, RESET_SIZE)
        reply = await reset_consumer(conn, RESET, RESET_CONSUMER, seq=wanted)
        op.result.update(wanted=wanted, reset_seq=reply.get("reset_seq"))
        try:  # the check reads with plain nats-py: its failures are the probe's, not the client's
            sub = await conn.js.pull_subscribe("chr.x", durable=RESET_CONSUMER, stream=RESET)
            try:
                msgs = await sub.fetch(1, timeout=conn.settings.request_timeout)
                await msgs[0].ack()
            finally:
                await sub.unsubscribe()
        except (TimeoutError, nats.errors.Error) as exc:
            op.fail(PROBE_FAILED, f"reset to {wanted} answered {reply.get('reset_seq')}; the delivery check "
                                  f"failed: {type(exc).__name__}: {exc}")
            return
        op.succeed(delivered=msgs[0].metadata.sequence.stream)

    await _repeat(ctx, "reset", None, one, pause=(0.2, 0.5))


async def ledger(ctx: Context, conn: JetStreamConnection) -> None:
    """Atomic batches (with msg ids) recorded in the batch ledger, then claimed and marked consumed."""
    book = await BatchLedger.open(conn, LEDGER_BUCKET, create=False)

    async def one(op: Op) -> None:
        result = await publish_atomic_batch(conn, _messages("chl.x", op, ids=True), batch_id=op.id)
        op.result.update(published=result.to_dict())
        await book.record(LEDGER_RUN, op.id, stream=LEDGER_DATA, count=result.count,
                          first_seq=result.first_seq, last_seq=result.last_seq)
        claim = await book.claim(LEDGER_RUN, op.id)
        state = "published"
        if claim is not None:
            state = (await book.mark_consumed(claim)).state
        op.succeed(**result.to_dict(), state=state)

    await _repeat(ctx, "ledger", (2, 10), one)


async def zombie_writer(ctx: Context, conn: JetStreamConnection) -> None:
    """The zombie-writer fault: a job's writer (its own process, tests/chaos/zombie_writer.py) freezes itself
    after the server committed its first chunk; once the stream's duplicate window has passed, a replacement
    writes the same job (same rows, same msg ids) to the end; then the frozen writer resumes and goes on. The
    checker wants every row of the job exactly once."""
    servers = ",".join(ctx.settings.servers)

    async def one(op: Op) -> None:
        args = [sys.executable, "-m", "tests.chaos.zombie_writer", servers, ZOMBIE, "chz.x", op.id,
                str(len(op.keys)), str(ZOMBIE_CHUNK)]
        zombie = await asyncio.create_subprocess_exec(*args, "--freeze-after-first-chunk", stdout=PIPE)
        try:
            await _frozen(zombie.pid, ctx.op_limit)
            await asyncio.sleep(ZOMBIE_WINDOW * 1.5)  # the fault itself: the window passes while it is frozen
            result = await write_job(ctx.settings, ZOMBIE, "chz.x", op.id, op.keys, ZOMBIE_CHUNK)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(zombie.pid, signal.SIGCONT)
        late, _ = await zombie.communicate()
        op.succeed(**result, zombie=json.loads(late or b"null"))

    await _repeat(ctx, "zombie-writer", (ZOMBIE_CHUNK + 1, 4 * ZOMBIE_CHUNK), one, pause=(0.5, 1.0))


async def _frozen(pid: int, limit: float) -> None:
    """Return once process ``pid`` is stopped (it stops itself); fail after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the zombie writer {pid} did not freeze in {limit:.0f}s")
        await asyncio.sleep(0.05)


WORKLOADS: dict[str, Callable[[Context, JetStreamConnection], Awaitable[None]]] = {
    "atomic-ids": lambda ctx, conn: atomic(ctx, conn, ids=True),
    "atomic-noid": lambda ctx, conn: atomic(ctx, conn, ids=False),
    "fast": fast,
    "batcher": lambda ctx, conn: batcher(ctx, conn, workqueue=False),
    "batcher-wq": lambda ctx, conn: batcher(ctx, conn, workqueue=True),
    "reset": consumer_reset,
    "ledger": ledger,
    "zombie-writer": zombie_writer,
}


async def run_workload(name: str, ctx: Context) -> None:
    """One workload on its own connection (opened before the faults start, closed at the end)."""
    conn = await connect(ctx.settings)
    try:
        await WORKLOADS[name](ctx, conn)
    finally:
        await conn.close()

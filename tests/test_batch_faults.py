"""Faults during atomic batches, against a real nats-server: a killed client, a cut connection, and 200
randomised batches with injected failures. The property checked is on the stream's contents: every batch is
stored whole (contiguous, in order) or not at all."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_jetstream.client import (
    BatchMessage,
    ConnectionSettings,
    JetStreamError,
    ensure_stream,
    open_connection,
    publish_atomic_batch,
    stream_info,
)
from airflow_jetstream.client.batches import atomic as atomic_batch_module
from airflow_jetstream.client.connection import connect
from tests.support.tcp_proxy import CuttableProxy

ATOM = {"name": "ATOM", "subjects": ["atom.>"], "allow_atomic": True, "max_msg_size": 1024}
ABANDONED = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.ATOM"
BATCH_LIMITS = {"limits": {"batch": {"timeout": "1s"}}}


async def stream_contents(conn, stream: str = "ATOM") -> list[tuple[str, dict]]:
    state = (await stream_info(conn, stream))["state"]
    out = []
    for seq in range(state.get("first_seq", 1), state["last_seq"] + 1):
        msg = (await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq}))["message"]
        out.append((msg["subject"], json.loads(base64.b64decode(msg["data"]))))
    return out


async def wait_for_abandoned(sub, batch_id: str, deadline_s: float = 15.0) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while True:
        msg = await sub.next_msg(timeout=max(0.01, deadline - loop.time()))
        event = json.loads(msg.data)
        if event.get("batch") == batch_id:
            return event


CHILD = '''
import asyncio, os, signal, sys
from airflow_jetstream.client import BatchMessage, ConnectionSettings, open_connection, publish_atomic_batch
from airflow_jetstream.client.batches import atomic as atomic_batch

url, batch_id = sys.argv[1], sys.argv[2]
real_write = atomic_batch.write_raw
writes = []

async def write_then_die(nc, frames):
    await real_write(nc, frames)
    writes.append(len(frames))
    if len(writes) == 3:           # first message + two flow segments are on the server
        await nc.flush()
        os.kill(os.getpid(), signal.SIGKILL)

atomic_batch.write_raw = write_then_die

async def main():
    async with open_connection(ConnectionSettings(servers=url)) as conn:
        msgs = [BatchMessage("atom.kill", b'{"i": %d}' % i) for i in range(1000)]
        await publish_atomic_batch(conn, msgs, batch_id=batch_id, flow_every=100)

asyncio.run(main())
'''


def test_client_killed_mid_batch_stores_nothing_and_raises_abandoned_advisory(nats_server_factory, tmp_path):
    server = nats_server_factory(jetstream=BATCH_LIMITS)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))

    async def go():
        async with open_connection(ConnectionSettings(servers=server.url)) as conn:
            await ensure_stream(conn, ATOM)
            sub = await conn.nc.subscribe(ABANDONED)
            await conn.nc.flush()
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
            child = await asyncio.create_subprocess_exec(sys.executable, str(script), server.url, "killed-batch",
                                                         env=env)
            code = await asyncio.wait_for(child.wait(), 60)
            advisory = await wait_for_abandoned(sub, "killed-batch")
            return code, advisory, (await stream_info(conn, "ATOM"))["state"]

    code, advisory, state = asyncio.run(go())
    assert code == -signal.SIGKILL
    assert advisory["type"] == "io.nats.jetstream.advisory.v1.stream_batch_abandoned"
    assert advisory["stream"] == "ATOM" and advisory["reason"] == "timeout"
    assert state["messages"] == 0 and state["last_seq"] == 0


def test_connection_cut_mid_batch_stores_nothing(nats_server_factory, monkeypatch):
    server = nats_server_factory(jetstream=BATCH_LIMITS)
    real_write = atomic_batch_module.write_raw
    proxy_box: list[CuttableProxy] = []
    writes: list[int] = []

    async def write_then_cut(nc, frames):
        if len(writes) == 3:
            await nc.flush()  # what was sent so far reached the server
            proxy_box[0].cut()
        writes.append(len(frames))
        await real_write(nc, frames)

    monkeypatch.setattr(atomic_batch_module, "write_raw", write_then_cut)

    async def go():
        proxy = await CuttableProxy(server.port).start()
        proxy_box.append(proxy)
        async with open_connection(ConnectionSettings(servers=server.url)) as admin:
            await ensure_stream(admin, ATOM)
            sub = await admin.nc.subscribe(ABANDONED)
            await admin.nc.flush()
            settings = ConnectionSettings(servers=f"nats://127.0.0.1:{proxy.port}", request_timeout=2)
            client = await connect(settings, allow_reconnect=False)
            msgs = [BatchMessage("atom.cut", b'{"i": %d}' % i) for i in range(500)]
            with pytest.raises(JetStreamError) as info:
                await publish_atomic_batch(client, msgs, batch_id="cut-batch", flow_every=50)
            await client.close()
            advisory = await wait_for_abandoned(sub, "cut-batch")
            state = (await stream_info(admin, "ATOM"))["state"]
        await proxy.close()
        return info.value, advisory, state

    error, advisory, state = asyncio.run(go())
    assert error.reason in ("connection_lost", "timeout")
    assert advisory["reason"] == "timeout"
    assert state["messages"] == 0


@pytest.mark.parametrize("seed", [20261126])
def test_randomised_batches_are_all_or_nothing(nats_server_factory, monkeypatch, seed):
    """200 batches; about half get a fault: an oversized message mid-batch, a wrong expected-last-seq, a wrong
    per-subject expectation, a msg id already stored, or the connection cut mid-batch."""
    rng = random.Random(seed)
    server = nats_server_factory(jetstream=BATCH_LIMITS)
    real_write = atomic_batch_module.write_raw
    cut_plan: dict[str, int] = {"at": -1, "writes": 0}
    proxy_box: list[CuttableProxy] = []

    async def maybe_cut(nc, frames):
        if cut_plan["writes"] == cut_plan["at"]:
            await nc.flush()
            proxy_box[0].cut()
        cut_plan["writes"] += 1
        await real_write(nc, frames)

    monkeypatch.setattr(atomic_batch_module, "write_raw", maybe_cut)
    outcomes: dict[int, str] = {}
    sizes: dict[int, int] = {}

    async def go():
        proxy = await CuttableProxy(server.port).start()
        proxy_box.append(proxy)
        async with open_connection(ConnectionSettings(servers=server.url)) as admin:
            await ensure_stream(admin, ATOM)
            conn = await connect(ConnectionSettings(servers=f"nats://127.0.0.1:{proxy.port}", request_timeout=1),
                                 reconnect_time_wait=0.05, max_reconnect_attempts=-1)
            try:
                for batch in range(200):
                    size = rng.randint(1, 40)
                    sizes[batch] = size
                    msgs = [BatchMessage(f"atom.s{rng.randint(0, 4)}", json.dumps({"b": batch, "i": i}).encode(),
                                         msg_id=f"b{batch}-{i}") for i in range(size)]
                    fault = rng.choice(["none"] * 5 + ["oversized", "expected", "subject_expected", "dup", "cut"])
                    kwargs: dict = {"flow_every": 5}
                    last = (await stream_info(admin, "ATOM"))["state"]["last_seq"]
                    if fault == "oversized":
                        k = rng.randrange(size)
                        msgs[k] = BatchMessage(msgs[k].subject, json.dumps({"b": batch, "i": k, "pad": "x" * 2000})
                                               .encode(), msg_id=msgs[k].msg_id)
                    elif fault == "expected":
                        kwargs["expected_last_seq"] = last + rng.choice([-1, 1, 7]) if last else 3
                    elif fault == "subject_expected":
                        k = rng.randrange(size)
                        msgs[k] = BatchMessage(msgs[k].subject, msgs[k].data, msg_id=msgs[k].msg_id,
                                               expected_last_subject_seq=last + 1000)
                    elif fault == "dup" and batch > 0 and outcomes.get(batch - 1) == "committed":
                        k = rng.randrange(size)
                        msgs[k] = BatchMessage(msgs[k].subject, msgs[k].data, msg_id=f"b{batch - 1}-0")
                    elif fault == "cut":
                        cut_plan["writes"] = 0
                        cut_plan["at"] = rng.randint(1, max(1, size // 5 + 1))
                    else:
                        kwargs["expected_last_seq"] = last if rng.random() < 0.5 else None
                    try:
                        result = await publish_atomic_batch(conn, msgs, timeout=0.5, **kwargs)
                        # A batch made only of already-stored msg ids is reported as already committed.
                        outcomes[batch] = "already_committed" if result.already_committed else "committed"
                    except JetStreamError as exc:
                        outcomes[batch] = exc.reason
                    cut_plan["at"] = -1
                    await conn.nc.flush(timeout=5)
                contents = await stream_contents(admin)
            finally:
                await conn.close()
                await proxy.close()
        return contents

    contents = asyncio.run(go())
    by_batch: dict[int, list[tuple[int, int]]] = {}
    for position, (_subject, data) in enumerate(contents):
        by_batch.setdefault(data["b"], []).append((position, data["i"]))
    for batch, stored in by_batch.items():
        positions = [p for p, _ in stored]
        assert [i for _, i in stored] == list(range(sizes[batch])), f"batch {batch} is partial or out of order"
        assert positions == list(range(positions[0], positions[0] + sizes[batch])), f"batch {batch} interleaved"
    committed = {b for b, o in outcomes.items() if o == "committed"}
    unknown = {b for b, o in outcomes.items() if o in ("timeout", "connection_lost")}
    refused = {b for b, o in outcomes.items() if o not in ("committed", "already_committed")} - unknown
    assert committed <= set(by_batch), "every committed batch is stored"
    assert not (refused & set(by_batch)), "no refused batch left anything behind"
    assert len(committed) > 60 and len(refused) > 30, outcomes
    reasons = {outcomes[b] for b in refused}
    assert {"wrong_last_sequence", "duplicate_msg_id", "message_too_large", "batch_incomplete"} <= reasons, reasons

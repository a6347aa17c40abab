"""Past the server's 1,000-consumers-per-stream default, as a triggerer runs them: 1,500 advisory, 1,500 KV and
1,500 message triggers on one event loop (each serialized, rebuilt from its classpath and run), against one
nats-server whose streams leave max_consumers at its default. Then 1,000 KV triggers fire while 1,000 new ones
start on the same bucket. Every trigger gets its own event, none an error; each stream never holds more than
one consumer (one per process), and none is left when the last trigger ends.

Before the triggers shared a subscription, each held its own consumer: the 1,001st of a stream was refused
(10026) and at this size 500 of each kind failed."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.advisories.capture import capture_stream_config
from airflow_jetstream.client.kv.bucket import ensure_bucket
from airflow_jetstream.triggers.advisory import JetStreamAdvisoryTrigger
from airflow_jetstream.triggers.await_message import JetStreamAwaitMessageTrigger
from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger
from tests.conftest import set_nats_connection
from tests.support.triggerer import start

COUNT = 1_500
FIRED_WHILE_STARTING = 1_000
ADVISORY = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED"


def consumers_per_stream(server) -> dict[str, int]:
    jsz = server.monitor("jsz?accounts=true&streams=true")
    return {stream["name"]: int(stream.get("state", {}).get("consumer_count", 0))
            for account in jsz.get("account_details", []) for stream in account.get("stream_detail", [])}


async def in_chunks(coros, size: int = 200) -> None:
    coros = list(coros)
    for at in range(0, len(coros), size):
        await asyncio.gather(*coros[at:at + size])


def test_1500_triggers_of_each_kind_in_one_loop_hold_one_consumer_per_stream(nats_server, monkeypatch):
    # thousands of requests at once on a busy 2-core box: allow slow API replies
    set_nats_connection(monkeypatch, "nats_default", nats_server.url, extra={"request_timeout": 30})
    tag = uuid.uuid4().hex[:6]
    capture, bucket, stream = f"CAPTURE_{tag}", f"scale_{tag}", f"SCALE_{tag}"
    since = datetime.now(UTC).isoformat()
    most: dict[str, int] = defaultdict(int)

    def kv_triggers(prefix: str, count: int) -> list:
        return [JetStreamKeyValueTrigger(bucket=bucket, key=f"{prefix}{i}", value="ready") for i in range(count)]

    async def sample_consumers(stop: asyncio.Event) -> None:
        while not stop.is_set():  # a record of what the server holds, not a wait
            for name, count in (await asyncio.to_thread(consumers_per_stream, nats_server)).items():
                most[name] = max(most[name], count)
            await asyncio.sleep(0.25)

    async def scenario():
        settings = ConnectionSettings(servers=nats_server.url, request_timeout=30, client_name="scale-admin")
        async with open_connection(settings) as admin:
            await ensure_stream(admin, capture_stream_config(capture, max_age="1h"))
            await ensure_bucket(admin, bucket)
            await ensure_stream(admin, {"name": stream, "subjects": [f"{stream}.>"]})
            for name in (capture, f"KV_{bucket}", stream):  # the server's default limit of 1,000 applies
                assert (await admin.api_request(f"STREAM.INFO.{name}"))["config"]["max_consumers"] in (-1, 1000)
            stop = asyncio.Event()
            sampler = asyncio.ensure_future(sample_consumers(stop))
            started = time.monotonic()
            advisories = start([JetStreamAdvisoryTrigger(advisory="batch_abandoned", advisory_stream=stream,
                                                         batch_id=f"b{i}", capture_stream=capture, start_time=since)
                                for i in range(COUNT)])
            messages = start([JetStreamAwaitMessageTrigger(stream=stream, filter_subject=f"{stream}.m{i}",
                                                           apply_function="builtins.bool", start_seq=1)
                              for i in range(COUNT)])
            first_kv = start(kv_triggers("k", COUNT))
            waiting = [*advisories, *messages, *first_kv]
            # the first 1,000 KV triggers fire while 1,000 new ones start on the same bucket
            await in_chunks(admin.js.publish(f"$KV.{bucket}.k{i}", b"ready") for i in range(FIRED_WHILE_STARTING))
            second_kv = start(kv_triggers("n", FIRED_WHILE_STARTING))
            fired = await asyncio.wait_for(asyncio.gather(*first_kv[:FIRED_WHILE_STARTING]), 120)
            await in_chunks(admin.js.publish(f"$KV.{bucket}.{key}", b"ready") for key in
                            [*(f"k{i}" for i in range(FIRED_WHILE_STARTING, COUNT)),
                             *(f"n{i}" for i in range(FIRED_WHILE_STARTING))])
            await in_chunks(admin.js.publish(f"{ADVISORY}.{stream}", json.dumps(
                {"type": "io.nats.jetstream.advisory.v1.stream_batch_abandoned", "id": f"a{i}",
                 "timestamp": datetime.now(UTC).isoformat(), "stream": stream, "batch": f"b{i}",
                 "reason": "timeout"}).encode()) for i in range(COUNT))
            await in_chunks(admin.js.publish(f"{stream}.m{i}", b"x") for i in range(COUNT))
            events = await asyncio.wait_for(asyncio.gather(*waiting, *second_kv), 300)
            seconds = time.monotonic() - started
            stop.set()
            await sampler
            return fired, events, seconds

    fired, events, seconds = asyncio.run(scenario())
    print(f"{len(events)} triggers ({COUNT} of each kind + {FIRED_WHILE_STARTING} started while as many fired) "
          f"in {seconds:.1f} s; most consumers per stream: {dict(most)}")
    errors = [e for e in events if e["status"] != "matched"]
    assert not errors, f"{len(errors)} of {len(events)} triggers did not match, e.g. {errors[0]}"
    assert all(e["status"] == "matched" for e in fired)
    assert [e["advisory"]["batch"] for e in events[:COUNT]] == [f"b{i}" for i in range(COUNT)]
    assert [e["message"]["subject"] for e in events[COUNT:2 * COUNT]] == [f"{stream}.m{i}" for i in range(COUNT)]
    keys = [e["entry"]["key"] for e in events[2 * COUNT:]]
    assert keys == [*(f"k{i}" for i in range(COUNT)), *(f"n{i}" for i in range(FIRED_WHILE_STARTING))]
    assert max(most[capture], most[f"KV_{bucket}"], most[stream]) == 1, dict(most)
    left = consumers_per_stream(nats_server)
    assert (left[capture], left[f"KV_{bucket}"], left[stream]) == (0, 0, 0), left

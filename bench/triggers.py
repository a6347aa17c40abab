"""Thousands of deferred sensors, as triggerers run them: errors, consumers, memory, idle CPU, latency, loop stalls.

For each server (one nats-server, a 3-node cluster), each kind of waiting trigger and each count N, the bench
starts two triggerer-like processes (``--processes``), each running N/2 triggers on one event loop the way
Airflow's triggerer does: each trigger serialized, its kwargs stored and read back, its class imported from the
classpath and ``run()`` as a task. Then it measures:

- **startup**: seconds until the processes are idle again (every trigger did its first look), the longest the
  event loop was blocked meanwhile (a 50 ms watchdog, as Airflow's own), and the triggers that ended in error.
  Triggers start ``--start-per-loop`` at a time (50: Airflow 3.2+'s ``[triggerer] max_trigger_to_select_per_loop``;
  0: all at once, the worst case, whose stall is every trigger's first step in one loop iteration);
- **idle**: consumers per stream on the server (its ``consumer_count``), RSS and CPU per waiting trigger over a
  ``--idle`` seconds window, the longest loop stall;
- **firing**: ``--probes`` triggers are fired one at a time, 20 ms apart (event latency p50/p99: publish to
  event), then all the others at once (seconds until every trigger fired, the longest loop stall, errors).

Kinds: ``advisory`` (batch_abandoned advisories on the capture stream), ``kv`` (a key to equal a value),
``message`` (a message on a subject), ``consumer`` (a durable consumer to be drained; 50 consumers, polled every
``--poll-interval`` seconds). ``--baseline-tree`` runs the same against another checkout (the code before the
shared subscriptions) in the same run, for ``--baseline-counts``, and prints ratios::

    .venv/bin/python bench/triggers.py --counts 100 1000 --kinds kv --servers single
    .venv/bin/python bench/triggers.py --baseline-tree /tmp/triggers-baseline --json /tmp/triggers.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
KINDS = ("advisory", "kv", "message", "consumer")
ADVISORY = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED"
CONSUMERS = 50  # the consumer kind: triggers wait on this many durable consumers
WATCHDOG = 0.05
READ_LIMIT = 1 << 24  # a child's last line lists every trigger it fired (~35 bytes each; asyncio's default: 64 KiB)


# ------------------------------------------------------------------------------------------------ child


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def make_triggers(kind: str, names: dict[str, str], indices: list[int], since: str, poll: float) -> list[Any]:
    if kind == "advisory":
        from airflow_jetstream.triggers.advisory import JetStreamAdvisoryTrigger

        return [JetStreamAdvisoryTrigger(advisory="batch_abandoned", advisory_stream=names["stream"],
                                         batch_id=f"b{i}", capture_stream=names["capture"], start_time=since)
                for i in indices]
    if kind == "kv":
        from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger

        return [JetStreamKeyValueTrigger(bucket=names["bucket"], key=f"k{i}", value="ready") for i in indices]
    if kind == "message":
        import inspect

        from airflow_jetstream.triggers.await_message import JetStreamAwaitMessageTrigger

        # the subject filter's name since the one vocabulary (the baseline tree has the former one)
        name = "filter_subject" if "filter_subject" in inspect.signature(JetStreamAwaitMessageTrigger).parameters \
            else "subject"
        return [JetStreamAwaitMessageTrigger(stream=names["stream"], apply_function="builtins.bool", start_seq=1,
                                             **{name: f"{names['stream']}.m{i}"}) for i in indices]
    from airflow_jetstream.triggers.consumer import JetStreamConsumerDrainedTrigger

    return [JetStreamConsumerDrainedTrigger(stream=names["work"], consumer=f"c{i % CONSUMERS}", poll_interval=poll)
            for i in indices]


def rebuilt(trigger: Any) -> Any:
    """As the triggerer builds a trigger from its database row."""
    from airflow._shared.module_loading import import_string
    from airflow.models.trigger import Trigger
    from airflow.serialization.decoders import smart_decode_trigger_kwargs

    classpath, kwargs = trigger.serialize()
    stored = Trigger._decrypt_kwargs(Trigger.encrypt_kwargs(kwargs))
    return import_string(classpath)(**{key: smart_decode_trigger_kwargs(value) for key, value in stored.items()})


class Watchdog:
    """The longest time the loop was blocked past a 50 ms sleep, per phase."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(WATCHDOG)
            self.worst = max(self.worst, time.monotonic() - before - WATCHDOG)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return round(worst * 1000, 1)


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def until_idle(busy_share: float = 0.1, step: float = 0.5, limit: float = 600.0) -> float:
    """Seconds until the process used under ``busy_share`` of a core over ``step`` seconds."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        cpu = time.process_time()
        await asyncio.sleep(step)
        if time.monotonic() - started > 1.0 and time.process_time() - cpu < busy_share * step:
            return time.monotonic() - started - step
    return limit


#: Imported before measuring, so that memory and stalls are the triggers' own, not the first imports'.
WARM_IMPORTS = ("airflow_jetstream.client.connection_pool", "airflow_jetstream.client.kv.keys",
                "airflow_jetstream.client.advisories.capture", "airflow_jetstream.client.reading.read_plan",
                "airflow_jetstream.client.admin.consumers", "airflow_jetstream.client.reading.shared_tail")


async def child(args: argparse.Namespace) -> None:
    import importlib

    for module in WARM_IMPORTS:
        with contextlib.suppress(ImportError):  # the baseline has no shared_tail
            importlib.import_module(module)
    names = json.loads(args.names)
    indices = list(range(args.first, args.count, args.step))
    watchdog = Watchdog()
    watching = asyncio.ensure_future(watchdog.run())
    triggers = [rebuilt(t) for t in make_triggers(args.kind, names, indices, args.since, args.poll_interval)]
    fired: dict[int, tuple[float, str]] = {}

    async def wait(index: int, trigger: Any) -> None:
        events = trigger.run()
        try:
            event = (await anext(events)).payload
        finally:
            await events.aclose()
        fired[index] = (time.time(), event.get("status", "?"))

    rss, watchdog.worst = rss_kib(), 0.0
    per_loop = args.start_per_loop or len(triggers)
    tasks: list[asyncio.Future[None]] = []
    for at in range(0, len(triggers), per_loop):
        tasks += [asyncio.ensure_future(wait(i, t)) for i, t in zip(indices[at:at + per_loop],
                                                                     triggers[at:at + per_loop], strict=True)]
        await asyncio.sleep(0)  # the next ones in a later loop iteration, as the triggerer hands them over
    settle = await until_idle()
    say(event="ready", startup_s=round(settle, 2), startup_stall_ms=watchdog.take(),
        rss_kib_per_trigger=round((rss_kib() - rss) / len(indices), 2),
        early=[status for status in (s for _, s in fired.values())])
    cpu, started = time.process_time(), time.monotonic()
    await asyncio.sleep(args.idle)
    say(event="idle", cpu_ms_per_s=round((time.process_time() - cpu) / (time.monotonic() - started) * 1000, 2),
        idle_stall_ms=watchdog.take())
    await asyncio.to_thread(sys.stdin.readline)  # the parent starts firing
    watchdog.take()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*tasks), args.deadline)
    say(event="done", fire_stall_ms=watchdog.take(), fired={str(i): v for i, v in fired.items()},
        missing=len(indices) - len(fired))
    watching.cancel()


# ------------------------------------------------------------------------------------------------ parent


async def fixtures(conn: Any, kind: str, count: int, replicas: int) -> dict[str, str]:
    from airflow_jetstream.client import ensure_stream
    from airflow_jetstream.client.advisories.capture import capture_stream_config
    from airflow_jetstream.client.kv.bucket import ensure_bucket

    tag = uuid.uuid4().hex[:6]
    names = {"capture": f"CAP_{tag}", "bucket": f"b_{tag}", "stream": f"S_{tag}", "work": f"W_{tag}"}
    if kind == "advisory":
        await ensure_stream(conn, capture_stream_config(names["capture"], max_age="1h", num_replicas=replicas))
        names["watched"] = names["capture"]
    elif kind == "kv":
        await ensure_bucket(conn, names["bucket"], num_replicas=replicas)
        names["watched"] = f"KV_{names['bucket']}"
    elif kind == "message":
        await ensure_stream(conn, {"name": names["stream"], "subjects": [f"{names['stream']}.>"],
                                   "num_replicas": replicas})
        names["watched"] = names["stream"]
    else:
        work = names["work"]
        await ensure_stream(conn, {"name": work, "subjects": [f"{work}.>"], "num_replicas": replicas})
        for j in range(min(count, CONSUMERS)):
            await conn.api_request(f"CONSUMER.CREATE.{work}.c{j}", {"stream_name": work, "config": {
                "durable_name": f"c{j}", "ack_policy": "explicit", "filter_subject": f"{work}.c{j}"}})
            await conn.js.publish(f"{work}.c{j}", b"job")
        names["watched"] = work
    return names


async def fire(conn: Any, kind: str, names: dict[str, str], index: int) -> None:
    if kind == "advisory":
        body = {"type": "io.nats.jetstream.advisory.v1.stream_batch_abandoned", "id": f"a{index}",
                "timestamp": datetime.now(UTC).isoformat(), "stream": names["stream"], "batch": f"b{index}",
                "reason": "timeout"}
        await conn.js.publish(f"{ADVISORY}.{names['stream']}", json.dumps(body).encode())
    elif kind == "kv":
        await conn.js.publish(f"$KV.{names['bucket']}.k{index}", b"ready")
    elif kind == "message":
        await conn.js.publish(f"{names['stream']}.m{index}", b"x")
    else:
        sub = await conn.js.pull_subscribe_bind(f"c{index}", names["work"])
        for msg in await sub.fetch(1, timeout=10):
            await msg.ack_sync()
        await sub.unsubscribe()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


async def read_line(proc: asyncio.subprocess.Process, want: str, errors: Any) -> dict[str, Any]:
    while True:
        line = await proc.stdout.readline()
        if not line:
            errors.seek(0)
            raise RuntimeError(f"a triggerer process ended before {want!r}: {errors.read()[-3000:]!r}")
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("event") == want:
            return message


async def measure(servers: str, replicas: int, kind: str, count: int, tree: Path, args: argparse.Namespace
                  ) -> dict[str, Any]:
    from airflow_jetstream.client import ConnectionSettings, open_connection

    settings = ConnectionSettings(servers=servers, request_timeout=30, client_name="bench-admin")
    with contextlib.ExitStack() as stack:
        async with open_connection(settings) as conn:
            names = await fixtures(conn, kind, count, replicas)
            host = ",".join(url.split("://", 1)[1] for url in servers.split(","))
            env = {**os.environ, "AIRFLOW_CONN_NATS_DEFAULT": json.dumps(
                       {"conn_type": "nats", "host": host, "extra": {"request_timeout": 30}}),
                   "PYTHONPATH": str(tree)}
            since = datetime.now(UTC).isoformat()
            # stderr to files: a pipe nobody reads while the triggers run would block a child that logs 64 KiB
            logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(args.processes)]
            procs = [await asyncio.create_subprocess_exec(
                sys.executable, str(HERE / "bench" / "triggers.py"), "--child", "--tree", str(tree), "--kind", kind,
                "--names", json.dumps(names), "--first", str(p), "--step", str(args.processes), "--count", str(count),
                "--since", since, "--idle", str(args.idle), "--poll-interval", str(args.poll_interval),
                "--deadline", str(args.deadline), "--start-per-loop", str(args.start_per_loop),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=logs[p], env=env, cwd=str(tree), limit=READ_LIMIT) for p in range(args.processes)]
            try:
                ready = [await read_line(proc, "ready", log) for proc, log in zip(procs, logs, strict=True)]
                consumers = 0
                idle: list[dict[str, Any]] = []
                pending = [asyncio.ensure_future(read_line(proc, "idle", log))
                           for proc, log in zip(procs, logs, strict=True)]
                while not all(p.done() for p in pending):  # what the server holds while they wait
                    info = await conn.api_request(f"STREAM.INFO.{names['watched']}")
                    consumers = max(consumers, int(info["state"].get("consumer_count", 0)))
                    await asyncio.wait(pending, timeout=1.0)
                idle = [p.result() for p in pending]
                for proc in procs:
                    proc.stdin.write(b"fire\n")
                    await proc.stdin.drain()
                targets = list(range(count)) if kind != "consumer" else list(range(min(count, CONSUMERS)))
                published: dict[int, float] = {}
                for index in targets[:args.probes]:
                    published[index] = time.time()
                    await fire(conn, kind, names, index)
                    await asyncio.sleep(0.02)
                probes = set(published)
                bulk_start = time.time()
                rest = targets[args.probes:]
                for at in range(0, len(rest), 200):
                    chunk = rest[at:at + 200]
                    for index in chunk:
                        published[index] = time.time()
                    await asyncio.gather(*(fire(conn, kind, names, index) for index in chunk))
                done = [await read_line(proc, "done", log) for proc, log in zip(procs, logs, strict=True)]
            finally:
                for proc in procs:
                    if proc.returncode is None:
                        proc.kill()
                    await proc.wait()
            left = int((await conn.api_request(f"STREAM.INFO.{names['watched']}"))["state"].get("consumer_count", 0))
            await conn.api_request(f"STREAM.DELETE.{names['watched']}")  # the next run captures advisories again
    fired = {int(i): v for d in done for i, v in d["fired"].items()}
    source = (lambda i: i % CONSUMERS) if kind == "consumer" else (lambda i: i)
    latencies = [fired[i][0] - published[source(i)] for i in fired if source(i) in probes]
    ok = ("matched", "success")
    errors = sum(1 for _, status in fired.values() if status not in ok) + sum(d["missing"] for d in done)
    last = max((t for t, _ in fired.values()), default=bulk_start)
    user_consumers = min(count, CONSUMERS) if kind == "consumer" else 0
    return {
        "kind": kind, "count": count, "errors": errors,
        "consumers": consumers - user_consumers, "consumers_left": left - user_consumers,
        "startup_s": max(r["startup_s"] for r in ready), "startup_stall_ms": max(r["startup_stall_ms"] for r in ready),
        "rss_kib_per_trigger": round(statistics.mean(r["rss_kib_per_trigger"] for r in ready), 2),
        "idle_cpu_us_per_s_per_trigger": round(sum(i["cpu_ms_per_s"] for i in idle) * 1000 / count, 3),
        "idle_stall_ms": max(i["idle_stall_ms"] for i in idle),
        "latency_p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "latency_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "fire_all_s": round(max(last - bulk_start, 0.0), 2), "fire_stall_ms": max(d["fire_stall_ms"] for d in done),
    }


COLUMNS = (("errors", "errors"), ("consumers", "consumers"), ("left", "consumers_left"),
           ("startup s", "startup_s"), ("start stall ms", "startup_stall_ms"), ("RSS KiB/trg", "rss_kib_per_trigger"),
           ("idle CPU us/s/trg", "idle_cpu_us_per_s_per_trigger"), ("idle stall ms", "idle_stall_ms"),
           ("p50 ms", "latency_p50_ms"), ("p99 ms", "latency_p99_ms"), ("fire all s", "fire_all_s"),
           ("fire stall ms", "fire_stall_ms"))


def table(rows: list[dict[str, Any]]) -> str:
    head = ["server", "code", "kind", "N", *(name for name, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(str(x) for x in (row["server"], row["code"], row["kind"], row["count"],
                                                          *(row[key] for _, key in COLUMNS))) + " |")
    return "\n".join(lines)


def growth(rows: list[dict[str, Any]]) -> list[str]:
    """Per 10x more triggers: how per-trigger costs and the totals grow (1.0 = per-trigger cost flat)."""
    out = []
    for row in rows:
        bigger = next((r for r in rows if (r["server"], r["code"], r["kind"]) == (row["server"], row["code"],
                                                                                   row["kind"])
                       and r["count"] == row["count"] * 10), None)
        if bigger is None:
            continue
        ratio = {key: (bigger[key] / row[key] if row[key] else float("nan"))
                 for key in ("rss_kib_per_trigger", "idle_cpu_us_per_s_per_trigger", "startup_s", "latency_p99_ms")}
        out.append(f"{row['server']} {row['code']} {row['kind']} {row['count']} -> {bigger['count']}: "
                   f"RSS/trigger x{ratio['rss_kib_per_trigger']:.2f}, idle CPU/trigger "
                   f"x{ratio['idle_cpu_us_per_s_per_trigger']:.2f}, startup x{ratio['startup_s']:.1f}, "
                   f"p99 x{ratio['latency_p99_ms']:.1f}, consumers {row['consumers']} -> {bigger['consumers']}")
    return out


async def parent(args: argparse.Namespace) -> list[dict[str, Any]]:
    from airflow_jetstream.embedded import EmbeddedNatsCluster, EmbeddedNatsServer

    rows: list[dict[str, Any]] = []
    codes = [("current", HERE)] + ([("baseline", Path(args.baseline_tree))] if args.baseline_tree else [])
    for server_kind in args.servers:
        with tempfile.TemporaryDirectory(prefix="bench-triggers-") as tmp:
            if server_kind == "single":
                server: Any = EmbeddedNatsServer(store_dir=Path(tmp) / "n").start()
                servers, replicas = server.url, 1
            else:
                server = EmbeddedNatsCluster(size=3, store_dir=Path(tmp) / "c").start()
                servers, replicas = server.servers, 3
            try:
                for kind in args.kinds:
                    for count in args.counts:
                        for code, tree in codes:
                            if code == "baseline" and count not in args.baseline_counts:
                                continue
                            row = {"server": server_kind, "code": code,
                                   **await measure(servers, replicas, kind, count, tree, args)}
                            print(table([row]).splitlines()[-1], flush=True)
                            rows.append(row)
            finally:
                server.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--servers", nargs="+", choices=("single", "cluster"), default=["single", "cluster"])
    parser.add_argument("--processes", type=int, default=2, help="triggerer processes sharing the triggers")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle window")
    parser.add_argument("--probes", type=int, default=100, help="triggers fired one at a time for the latency")
    parser.add_argument("--poll-interval", type=float, default=5.0, help="the consumer kind's poll interval")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds to wait for every trigger to fire")
    parser.add_argument("--start-per-loop", type=int, default=50,
                        help="triggers started per loop iteration (Airflow's max_trigger_to_select_per_loop; 0: all)")
    parser.add_argument("--baseline-tree", help="a checkout of the code to compare with (e.g. a git worktree)")
    parser.add_argument("--baseline-counts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--tree", "--kind", "--names", "--since"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    for name in ("--first", "--step", "--count"):
        parser.add_argument(name, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-triggers-"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    if args.child:
        sys.path.insert(0, args.tree)
        import logging

        logging.disable(logging.WARNING)  # the triggers' own log lines are not what is measured
        asyncio.run(child(args))
        return
    sys.path.insert(0, str(HERE))
    rows = asyncio.run(parent(args))
    print()
    print(table(rows))
    for line in growth(rows):
        print(line)
    for row in rows:
        base = next((r for r in rows if r["code"] == "baseline" and all(
            r[k] == row[k] for k in ("server", "kind", "count"))), None)
        if row["code"] == "current" and base is not None:
            print(f"{row['server']} {row['kind']} {row['count']}: baseline/current errors {base['errors']}/"
                  f"{row['errors']}, consumers {base['consumers']}/{row['consumers']}, RSS/trigger "
                  f"x{base['rss_kib_per_trigger'] / max(row['rss_kib_per_trigger'], 0.01):.2f}, idle CPU/trigger "
                  f"x{base['idle_cpu_us_per_s_per_trigger'] / max(row['idle_cpu_us_per_s_per_trigger'], 1e-3):.2f}"
                  f", startup x{base['startup_s'] / max(row['startup_s'], 0.01):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

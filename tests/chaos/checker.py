"""The invariant checker: reads every stream back with plain nats-py and judges each reported outcome.

Counted per run:

- ``lost``: messages of operations reported stored that no stream holds;
- ``duplicated``: extra copies of a message (a unique payload stored more than once); a job written by a
  zombie writer and its replacement is counted by row id: every row exactly once;
- ``partial``: atomic batches of which some but not all messages are stored;
- ``misreported``: operations whose report is false: reported ok but absent, a definite failure
  (the error says nothing was written) but present, or a wrong count, sequence or range;
- ``misleading``: failures blaming the cluster (no leader, quorum) when they were raised while no
  fault was active nor healed in the ``GRACE`` seconds before, and untyped errors;
- ``unknown``: failures that say their outcome is unknown (allowed: stored once or absent);
- the slowest operation, and ``late``: operations longer than ``leader_wait`` + 15 s;
- ``diverged``: streams whose replicas on the servers still differ after the run.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from tests.chaos.history import History, Op, key_of
from tests.chaos.nemesis import Nemesis
from tests.chaos.workloads import AGGREGATE, ATOMIC, BATCHED, FAST, LEDGER_BUCKET, LEDGER_DATA, ZOMBIE
from tests.support.kv_keys import kv_keys

GRACE = 15.0
LATE_MARGIN = 15.0
BLAMES_CLUSTER = re.compile(r"quorum|no leader|has no leader|leader_unavailable", re.IGNORECASE)
ATOMIC_WORKLOADS = ("atomic-ids", "atomic-noid", "ledger")
READ_STREAMS = (ATOMIC, FAST, BATCHED, AGGREGATE, LEDGER_DATA, ZOMBIE)
#: Where the read-back puts the ledger's counts among its records (no batch id has a space).
COUNTS = "counts of runs"
T = TypeVar("T")


@dataclass
class Stored:
    """Where each key is stored: key -> [(stream, seq)]."""

    places: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))

    def of(self, key: str) -> list[tuple[str, int]]:
        return self.places.get(key, [])


class ShortRead(RuntimeError):
    """A stream's read-back ended with fewer messages than the stream holds."""


#: Reading a stream back is redone whole (fresh consumer) this many times when the cluster cuts it short.
READ_ATTEMPTS = 6
#: Pause before a redone read: after a heal, consumer placement and route interest settle within seconds.
READ_PAUSE = 2.0
#: What cuts a read short right after a heal: no responders yet for the new consumer's pull requests or
#: an API request (503), its consumer gone (409), a request timing out, or a read that ended with fewer
#: messages than the stream holds. A redone read starts afresh, so redoing it after any of these is safe.
TRANSIENT_READ = (nats.js.errors.APIError, nats.errors.NoRespondersError, nats.errors.TimeoutError, ShortRead)


async def read_back(servers: list[str]) -> tuple[Stored, dict[str, dict[str, Any]]]:
    """Every message of the workload streams, and the ledger's records by batch id (plain nats-py)."""
    nc = await nats.connect(servers=servers, connect_timeout=5, max_reconnect_attempts=5)
    try:
        js = nc.jetstream(timeout=10)
        stored = Stored()
        for stream in READ_STREAMS:
            for key, place in await redone(f"stream {stream}", lambda s=stream: _read_stream_once(js, s)):
                stored.places[key].append(place)
        return stored, await redone(f"bucket {LEDGER_BUCKET}", lambda: _read_ledger_once(js))
    finally:
        await nc.close()


async def redone(what: str, read: Callable[[], Awaitable[T]]) -> T:
    """``read()``, redone whole (it starts afresh each time) while the cluster cuts it short; bounded."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            return await read()
        except TRANSIENT_READ as exc:
            if attempt == READ_ATTEMPTS:
                raise
            print(f"reading {what} back: {type(exc).__name__}: {exc}; read {attempt + 1} of "
                  f"{READ_ATTEMPTS} in {READ_PAUSE:.0f} s", flush=True)
            await asyncio.sleep(READ_PAUSE)
    raise AssertionError("unreachable")


async def _read_ledger_once(js: Any) -> dict[str, dict[str, Any]]:
    """The ledger's records by batch id; each run's counts (contract v2) under ``COUNTS`` as ``{run: [shard, ...]}``."""
    kv = await js.key_value(LEDGER_BUCKET)
    records: dict[str, dict[str, Any]] = {}
    counts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for key in await kv_keys(js, LEDGER_BUCKET):
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyDeletedError:
            continue
        if not entry.value:
            continue
        value = json.loads(entry.value)
        if len(key.split(".")) == 3:  # <run>./counts.<n>: a run's counts, not a batch
            counts[value["run_id"]].append(value)
        else:
            records[value["batch_id"]] = value
    if counts:
        records[COUNTS] = dict(counts)
    return records


async def _read_stream_once(js: Any, stream: str) -> list[tuple[str, tuple[str, int]]]:
    total = (await js.stream_info(stream)).state.messages
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, mem_storage=True, num_replicas=1, inactive_threshold=60)
    sub = await js.pull_subscribe(">", stream=stream, config=config)
    found: list[tuple[str, tuple[str, int]]] = []
    seen = 0
    try:
        for _ in range(total // 200 + 20):  # bounded: a few empty fetches are tolerated
            if seen >= total:
                break
            try:
                msgs = await sub.fetch(500, timeout=3)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                seen += 1
                key = key_of(msg.data)
                if key is not None:
                    found.append((key, (stream, msg.metadata.sequence.stream)))
    finally:
        await sub.unsubscribe()
    if seen < total:
        raise ShortRead(f"read {seen} of {total} messages of stream {stream}")
    return found


@dataclass
class Report:
    ops: int = 0
    messages: int = 0
    faults: int = 0
    lost: int = 0
    duplicated: int = 0
    partial: int = 0
    misreported: int = 0
    misleading: int = 0
    unknown: int = 0
    late: int = 0
    diverged: int = 0  # streams whose replicas differ after the run (a server defect, reported, not judged)
    slowest: float = 0.0
    slowest_op: str = ""
    failures: dict[str, int] = field(default_factory=dict)  # "workload: reason" -> count
    details: list[str] = field(default_factory=list)

    def add(self, counter: str, detail: str, amount: int = 1) -> None:
        setattr(self, counter, getattr(self, counter) + amount)
        self.details.append(f"{counter}: {detail}")

    @property
    def violations(self) -> int:
        return self.lost + self.duplicated + self.partial + self.misreported

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def check(history: History, stored: Stored, records: dict[str, dict[str, Any]], nemesis: Nemesis,
          leader_wait: float) -> Report:
    report = Report(ops=len(history.ops), faults=len(nemesis.done))
    for op in history.ops:
        report.messages += len(op.keys)
        if op.duration > report.slowest:
            report.slowest, report.slowest_op = op.duration, op.brief()
        if op.duration > leader_wait + LATE_MARGIN:
            report.add("late", op.brief())
        _check_copies(op, stored, report)
        if op.workload in ATOMIC_WORKLOADS:
            _check_atomic(op, stored, report)
        elif op.workload == "fast":
            _check_fast(op, stored, report)
        elif op.workload.startswith("batcher"):
            _check_item(op, stored, report)
        elif op.workload == "reset":
            _check_reset(op, report)
        elif op.workload == "zombie-writer":
            _check_rows_once(op, stored, report)
        if op.workload == "ledger":
            _check_ledger(op, stored, records.get(op.id), report)
        if not op.ok:
            what = f"{op.workload}: {op.reason}"
            report.failures[what] = report.failures.get(what, 0) + 1
            _check_error(op, nemesis, report)
    _check_ledger_counts(records, report)
    return report


def _check_copies(op: Op, stored: Stored, report: Report) -> None:
    for key in op.keys:
        extra = len(stored.of(key)) - 1
        if extra > 0:
            report.add("duplicated", f"{key} stored {extra + 1} times at {stored.of(key)} ({op.brief()})", extra)


def _absent(op: Op, stored: Stored) -> list[str]:
    return [k for k in op.keys if not stored.of(k)]


def _reported_ok_but_absent(op: Op, absent: list[str], report: Report) -> None:
    report.add("lost", f"{len(absent)} of {op.brief()} absent, first {absent[0]}", len(absent))
    report.add("misreported", f"reported ok but {len(absent)} messages absent: {op.brief()}")


def _check_atomic(op: Op, stored: Stored, report: Report) -> None:
    absent = _absent(op, stored)
    if 0 < len(absent) < len(op.keys):
        report.add("partial", f"{len(op.keys) - len(absent)} of {len(op.keys)} stored: {op.brief()}")
    batch = op.result.get("published", op.result)
    reported_ok = op.ok or "count" in batch
    if reported_ok:
        if absent:
            _reported_ok_but_absent(op, absent, report)
            return
        seqs = sorted(stored.of(k)[0][1] for k in op.keys)
        wanted = list(range(batch["first_seq"], batch["last_seq"] + 1))
        if seqs != wanted or batch["count"] != len(op.keys):
            report.add("misreported", f"{op.brief()} reported {batch['count']} at {batch['first_seq']}.."
                                      f"{batch['last_seq']}, stored at {seqs[0]}..{seqs[-1]} ({len(seqs)})")
    elif op.definite and len(absent) < len(op.keys):
        report.add("misreported", f"definite failure but stored: {op.brief()}: {op.message}")
    elif not op.definite:
        report.unknown += 1


def _check_fast(op: Op, stored: Stored, report: Report) -> None:
    absent = _absent(op, stored)
    present = len(op.keys) - len(absent)
    if op.ok:
        if absent:
            _reported_ok_but_absent(op, absent, report)
            return
        last = stored.of(op.keys[-1])[0][1]
        if op.result["count"] != len(op.keys) or op.result["last_seq"] != last:
            report.add("misreported", f"{op.brief()} reported count {op.result['count']} last_seq "
                                      f"{op.result['last_seq']}, stored {present} with the last at {last}")
        return
    said = op.result.get("stored")
    if said is not None:
        if present != said or any(stored.of(k) for k in op.keys[said:]):
            report.add("misreported", f"{op.brief()} said {said} stored, {present} are: {op.message}")
    elif op.definite and present:
        report.add("misreported", f"definite failure but {present} stored: {op.brief()}: {op.message}")
    else:
        report.unknown += 1


def _check_item(op: Op, stored: Stored, report: Report) -> None:
    places = stored.of(op.keys[0])
    if op.ok:
        if not places:
            _reported_ok_but_absent(op, op.keys, report)
        elif op.workload == "batcher" and places[0][1] != op.result.get("seq"):
            report.add("misreported", f"{op.brief()} reported seq {op.result.get('seq')}, stored at {places}")
    elif op.definite and places:
        report.add("misreported", f"definite failure but stored: {op.brief()}: {op.message}")
    elif not op.definite:
        report.unknown += 1


def _check_reset(op: Op, report: Report) -> None:
    if not op.ok:
        report.unknown += not op.definite
        return
    wanted, answered, delivered = op.result["wanted"], op.result["reset_seq"], op.result["delivered"]
    if answered != wanted or delivered != wanted:
        report.add("misreported", f"{op.brief()}: reset to {wanted} answered {answered}, delivered {delivered}")


def _check_rows_once(op: Op, stored: Stored, report: Report) -> None:
    """A job its replacement finished: every row id stored, each once (copies are counted for every workload);
    a replacement that failed may leave rows out, never in twice."""
    absent = _absent(op, stored)
    if op.ok and absent:
        _reported_ok_but_absent(op, absent, report)
    elif not op.ok and not op.definite:
        report.unknown += 1


def _check_ledger(op: Op, stored: Stored, record: dict[str, Any] | None, report: Report) -> None:
    if op.ok and record is None:
        report.add("misreported", f"{op.brief()} recorded, but the ledger has no record")
        return
    if record is None or _absent(op, stored):
        return
    seqs = sorted(stored.of(k)[0][1] for k in op.keys)
    facts = (len(seqs), seqs[0], seqs[-1])
    said = (record.get("count"), record.get("first_seq"), record.get("last_seq"))
    if said != facts:
        report.add("misreported", f"ledger record of {op.id} says (count, first, last) {said}, stream holds {facts}")
    if op.ok and record.get("state") != op.result.get("state"):
        report.add("misreported", f"ledger record of {op.id} is {record.get('state')}, reported "
                                  f"{op.result.get('state')}")


def _check_ledger_counts(records: dict[str, dict[str, Any]], report: Report) -> None:
    """Each run's counts (the sum of its shards) are what its records say: batches per state."""
    batches: dict[str, Counter[str]] = defaultdict(Counter)
    for batch_id, record in records.items():
        if batch_id != COUNTS:
            batches[record["run_id"]][record["state"]] += 1
    counted: dict[str, Counter[str]] = defaultdict(Counter)
    for run_id, shards in records.get(COUNTS, {}).items():
        for shard in shards:
            counted[run_id].update({state: n for state, n in shard["states"].items() if n})
    for run_id in sorted(set(batches) | set(counted)):
        if batches[run_id] != counted[run_id]:
            report.add("misreported", f"ledger counts of run {run_id} say {dict(sorted(counted[run_id].items()))}, "
                                      f"its records {dict(sorted(batches[run_id].items()))}")


def _check_error(op: Op, nemesis: Nemesis, report: Report) -> None:
    if op.reason == "untyped":
        report.add("misleading", f"untyped error: {op.brief()}: {op.message}")
    elif BLAMES_CLUSTER.search(op.message) and not nemesis.active_during(op.end, op.end, GRACE):
        report.add("misleading", f"blames the cluster {GRACE:.0f}+ s after the last fault healed: {op.brief()}: "
                                 f"{op.message[:200]}")

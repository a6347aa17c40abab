"""Exactly once by construction: fenced atomic writes commit once, whatever retries, re-runs or zombies do.

The duplicate window is 1 s here and every retry runs after it; the stream's msg-id memory is polled to be
sure it has forgotten. Rows are counted by id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.client import BatchMessage, ensure_stream, publish_atomic_batch, stream_info
from airflow_jetstream.client.batches.publish_chunks import publish_chunks
from airflow_jetstream.client.batches.wire import stored_sequences
from airflow_jetstream.client.errors import BatchPublishError, InvalidRequestError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.client.subjects import fence_namespace, fence_subject
from airflow_jetstream.embedded import EmbeddedNatsCluster, EmbeddedNatsServer
from tests.support.cluster_tools import call
from tests.support.nats_calls import call_on
from tests.support.polling import wait_for, wait_until
from tests.support.servers import module_server

server = module_server("fence")
ROOT = Path(__file__).resolve().parents[1]


def stream(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "subjects": [f"{name.lower()}.>"], "allow_atomic": True, "duplicate_window": "1s", **extra}


async def ids_stored(conn: Any, name: str) -> list[int]:
    """The ``id`` of every stored row of ``name``'s own subjects (fences left out), in stream order."""
    state = (await stream_info(conn, name))["state"]
    found: list[int] = []
    async for chunk in read_range(conn, name, state["first_seq"], state["last_seq"], subjects=[f"{name.lower()}.>"]):
        found.extend(json.loads(m[4])["id"] for m in chunk)
    return found


def forgotten(srv: EmbeddedNatsServer, subject: str, msg_id: str) -> bool:
    async def probe(conn: Any) -> bool:
        return (await stored_sequences(conn, [BatchMessage(subject, b"", msg_id=msg_id)]))[0] is None
    return bool(call_on(srv, probe))


def rows(first: int, last: int, subject: str) -> list[BatchMessage]:
    return [BatchMessage(subject, json.dumps({"id": n}).encode()) for n in range(first, last)]


def test_ensure_stream_gives_atomic_streams_their_fence_namespace(server: EmbeddedNatsServer) -> None:
    made = call_on(server, ensure_stream, stream("FNS"))
    assert made["info"]["config"]["subjects"] == ["fns.>", "_FENCE.FNS.>"] == ["fns.>", fence_namespace("FNS")]
    assert call_on(server, ensure_stream, stream("FNS"))["action"] == "unchanged"
    # an update naming other subjects (and not allow_atomic) keeps the atomic stream fenced
    moved = call_on(server, ensure_stream, {"name": "FNS", "subjects": ["fns.a", "fns.b"]})
    assert moved["info"]["config"]["subjects"] == ["fns.a", "fns.b", "_FENCE.FNS.>"]
    plain = call_on(server, ensure_stream, {"name": "FNP", "subjects": ["fnp.>"]})
    assert plain["info"]["config"]["subjects"] == ["fnp.>"]
    assert fence_subject("S", "job 7.a/b") == "_FENCE.S.job~207~2Ea~2Fb"
    assert fence_subject("S", "x" * 200).startswith("_FENCE.S.sha256~")


def test_a_fenced_batch_commits_once_at_any_later_time(server: EmbeddedNatsServer) -> None:
    call_on(server, ensure_stream, stream("FONE"))
    batch = rows(0, 5, "fone.a")
    first = call_on(server, publish_atomic_batch, batch, fence="job-1-0")
    assert (first.count, first.first_seq, first.last_seq, first.already_committed) == (5, 1, 5, False)
    again = call_on(server, publish_atomic_batch, batch, fence="job-1-0")
    assert (again.count, again.first_seq, again.last_seq, again.already_committed) == (5, 1, 5, True)
    assert again.batch == first.batch
    assert call_on(server, ids_stored, "FONE") == [0, 1, 2, 3, 4]
    assert call_on(server, stream_info, "FONE")["state"]["messages"] == 6  # five rows and their fence

    with pytest.raises(InvalidRequestError) as full:  # the fence is one more message than the caller's
        call_on(server, publish_atomic_batch, rows(0, 1000, "fone.a"), fence="job-1-1")
    assert full.value.reason == "batch_too_large" and "at most 999" in full.value.message

    with pytest.raises(BatchPublishError) as conflict:
        call_on(server, publish_atomic_batch, rows(0, 4, "fone.a"), fence="job-1-0")
    assert conflict.value.reason == "fence_conflict" and "other messages" in conflict.value.message
    assert call_on(server, ids_stored, "FONE") == [0, 1, 2, 3, 4]


def test_a_stream_that_cannot_keep_fences_is_refused_before_anything_is_sent(server: EmbeddedNatsServer) -> None:
    async def make(conn: Any) -> None:
        await conn.js.add_stream(name="FNOT", subjects=["fnot.>"], allow_atomic=True)  # made outside the provider
    call_on(server, make)
    call_on(server, ensure_stream, stream("FINT", retention="interest"))
    for name, fix in (("FNOT", "'_FENCE.FNOT.>' to its subjects"), ("FINT", "retention 'interest'")):
        with pytest.raises(BatchPublishError) as refused:
            call_on(server, publish_atomic_batch, rows(0, 3, f"{name.lower()}.a"), fence="f-1")
        assert refused.value.reason == "stream_not_fenced" and fix in refused.value.message
        assert call_on(server, stream_info, name)["state"]["messages"] == 0


def test_published_chunks_rerun_after_the_window_store_nothing_twice(server: EmbeddedNatsServer) -> None:
    call_on(server, ensure_stream, stream("FRUN"))
    chunks = [[BatchMessage("frun.a", json.dumps({"id": n}).encode(), msg_id=f"k-{n}") for n in range(i, i + 4)]
              for i in range(0, 12, 4)]
    first = call_on(server, publish_chunks, chunks[:2], stream="FRUN", fence_prefix="k")
    assert first.count == 8
    wait_until(lambda: forgotten(server, "frun.a", "k-0"), "the stream to forget msg id k-0 (1 s duplicate window)")
    rerun = call_on(server, publish_chunks, chunks, stream="FRUN", fence_prefix="k")
    assert (rerun.chunks, rerun.already_committed_chunks, rerun.count) == (3, 2, 12)
    assert call_on(server, ids_stored, "FRUN") == list(range(12))


# -- one write attempt of the Spark writer frozen or killed at each point, its replacement after the window ------

ATTEMPT_ROWS, CHUNK, STOP_CHUNK = 60, 20, 1


def attempt(srv: Any, name: str, number: int, tmp: Path, **stop: Any) -> subprocess.Popen[str]:
    servers = srv.servers if isinstance(srv, EmbeddedNatsCluster) else srv.url
    spec = {"servers": servers, "stream": name, "job_id": f"job-{name.lower()}", "subject": f"{name.lower()}.rows",
            "rows": ATTEMPT_ROWS, "batch_size": CHUNK, "ledger_bucket": f"LEDGER_{name}", "attempt": number,
            "marker": str(tmp / f"stopped-{number}"), "at_chunk": STOP_CHUNK, **stop}
    return subprocess.Popen([sys.executable, "-m", "tests.support.fenced_writer", json.dumps(spec)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def ledger_ranges(conn: Any, name: str) -> dict[str, tuple[int, int, int]]:
    ledger = await BatchLedger.open(conn, f"LEDGER_{name}")
    return {r.batch_id: (r.count, r.first_seq, r.last_seq) for r in await ledger.batches(f"job-{name.lower()}")}


def stopped(proc: subprocess.Popen[str]) -> bool:
    return Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1].startswith("T")


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["SIGSTOP", "SIGKILL"])
@pytest.mark.parametrize("point", ["before_first", "mid_batch", "after_commit", "after_record"])
def test_an_attempt_stopped_anywhere_and_its_retry_after_the_window_store_every_row_once(
        server: EmbeddedNatsServer, tmp_path: Path, point: str, how: str) -> None:
    name = f"FW{point.upper().replace('_', '')[:8]}{how[3:5]}"
    call_on(server, ensure_stream, stream(name))
    first = attempt(server, name, 0, tmp_path, point=point, signal=how)
    wait_until(lambda: (tmp_path / "stopped-0").exists() and (how == "SIGKILL" or stopped(first)),
               f"attempt 0 to stop at {point}", timeout=60)
    if how == "SIGKILL":
        first.wait(timeout=30)
    chunk0 = f"job-{name.lower()}-0-c0"
    wait_until(lambda: forgotten(server, f"{name.lower()}.rows", chunk0),
               "the stream to forget chunk 0's msg id (1 s duplicate window)", timeout=30)
    retry = attempt(server, name, 1, tmp_path)
    out, err = retry.communicate(timeout=120)
    assert retry.returncode == 0, err
    if how == "SIGSTOP":  # the zombie resumes after its replacement finished
        os.kill(first.pid, signal.SIGCONT)
        first.communicate(timeout=120)

    ids = call_on(server, ids_stored, name)
    assert sorted(ids) == list(range(ATTEMPT_ROWS)), f"rows stored more than once: {len(ids) - len(set(ids))}"
    recorded = call_on(server, ledger_ranges, name)
    assert sorted(recorded) == [f"job-{name.lower()}-0-{c}" for c in range(ATTEMPT_ROWS // CHUNK)]
    for batch_id, (count, first_seq, last_seq) in recorded.items():
        assert count == CHUNK and last_seq - first_seq + 1 == CHUNK, batch_id
    report = json.loads(out)
    assert report["rows"] == ATTEMPT_ROWS


def test_a_batcher_stores_each_msg_id_once_however_late_it_comes_again(server: EmbeddedNatsServer) -> None:
    """A Batcher as users open it (fenced by default) re-run after the duplicate window stores nothing twice;
    the explicit fence=False opt-out is bounded by the window, and stores the same items again after it."""
    from airflow_jetstream.client import Batcher

    call_on(server, ensure_stream, stream("FBAT"))

    async def publish(conn: Any, ids: range, subject: str = "fbat.a", **options: Any) -> list[Any]:
        async with Batcher(conn, **options) as batcher:
            futures = [await batcher.submit(BatchMessage(subject, json.dumps({"id": n}).encode(), msg_id=f"i-{n}"))
                       for n in ids]
            return [await f for f in futures]

    first = call_on(server, publish, range(0, 6))
    assert all(r.ok and not r.duplicate for r in first)
    wait_until(lambda: forgotten(server, "fbat.a", "i-0"), "the stream to forget msg id i-0 (1 s duplicate window)")
    again = call_on(server, publish, range(3, 9))  # three stored long ago, three new, in one group
    assert [r.duplicate for r in again] == [True] * 3 + [False] * 3 and all(r.ok for r in again)
    assert [r.seq for r in again[:3]] == [r.seq for r in first[3:]]
    assert sorted(call_on(server, ids_stored, "FBAT")) == list(range(9))

    async def without_id(conn: Any) -> Any:
        async with Batcher(conn) as batcher:
            return await batcher.publish("fbat.a", b"{}")
    assert call_on(server, without_id).error == "invalid_msg_id"

    call_on(server, ensure_stream, stream("FBOPT"))
    assert all(r.ok for r in call_on(server, publish, range(0, 3), "fbopt.a", fence=False))
    wait_until(lambda: forgotten(server, "fbopt.a", "i-0"), "the stream to forget msg id i-0 (1 s duplicate window)")
    late = call_on(server, publish, range(0, 3), "fbopt.a", fence=False)
    assert [r.duplicate for r in late] == [False] * 3, "the opt-out is bounded by the duplicate window"
    assert sorted(call_on(server, ids_stored, "FBOPT")) == [0, 0, 1, 1, 2, 2]


@pytest.mark.e2e
@pytest.mark.parametrize("point", ["mid_batch", "after_commit"])
def test_on_a_cluster_the_leader_killed_under_a_fenced_commit_and_a_late_retry_store_every_row_once(
        nats_cluster: EmbeddedNatsCluster, tmp_path: Path, point: str) -> None:
    """R3 stream: attempt 0 freezes at ``point`` of chunk 1 (its batch open on the leader, or committed and not
    recorded), the stream leader is SIGKILLed, the retry runs on the new leader after the duplicate window, then
    the zombie resumes (its open batch died with the old leader; its commit is refused by the fence)."""
    name = f"FC{point.upper().replace('_', '')[:8]}"
    call(nats_cluster, ensure_stream, stream(name, num_replicas=3))
    first = attempt(nats_cluster, name, 0, tmp_path, point=point, signal="SIGSTOP")
    wait_until(lambda: (tmp_path / "stopped-0").exists() and stopped(first), f"attempt 0 to stop at {point}",
               timeout=60)
    leader = wait_for(lambda: nats_cluster.stream_leader(name), f"the leader of {name}")
    nats_cluster.kill(leader)
    try:
        wait_for(lambda: nats_cluster.stream_leader(name) not in (None, leader), f"a new leader of {name}", limit=30)

        async def remembered(conn: Any) -> bool:
            chunk0 = BatchMessage(f"{name.lower()}.rows", b"", msg_id=f"job-{name.lower()}-0-c0")
            return (await stored_sequences(conn, [chunk0]))[0] is not None

        wait_until(lambda: not call(nats_cluster, remembered), "the stream to forget chunk 0's msg id", timeout=30)
        retry = attempt(nats_cluster, name, 1, tmp_path)
        _, err = retry.communicate(timeout=180)
        assert retry.returncode == 0, err
        os.kill(first.pid, signal.SIGCONT)
        first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
        nats_cluster.restart(leader)
    ids = call(nats_cluster, ids_stored, name)
    assert sorted(ids) == list(range(ATTEMPT_ROWS)), f"rows stored more than once: {len(ids) - len(set(ids))}"


def test_a_fence_digest_names_one_content() -> None:
    """Equal for the same subjects and payloads however they are held; different when a byte moves between a
    subject and its payload, between two payloads, or when the order changes."""
    from airflow_jetstream.client.batches.atomic import content_digest

    def digest(*pairs: tuple[str, bytes]) -> str:
        return content_digest([BatchMessage(subject, data) for subject, data in pairs])

    base = digest(("a.b", b"xy"), ("a.c", b"z"))
    assert base == content_digest([BatchMessage("a.b", bytearray(b"xy")), BatchMessage("a.c", memoryview(b"z"))])
    others = {digest(("a.b", b"x"), ("a.c", b"yz")), digest(("a.c", b"z"), ("a.b", b"xy")),
              digest(("a.bx", b"y"), ("a.c", b"z")), digest(("a.b", b"xy"), ("a.c", b"z"), ("a.c", b"")),
              digest(("a.b", b"xya.c"), ("", b"z"))}
    assert base not in others and len(others) == 5

"""Batches on a 3-node cluster with R3 streams while the stream leader is SIGKILLed and restarted.

Atomic batches go through JetStreamAtomicBatchPublishOperator with the retries an Airflow task makes
(every batch whole, exactly once); a fast batch cut by an election reports exactly what the stream
holds and a resume stores no duplicate.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.batches.fast import publish_fast_batch
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.errors import FastBatchError, JetStreamError
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.support.polling import async_wait_until, wait_until

FAST_TOTAL = 20_000


def cluster_settings(cluster: EmbeddedNatsCluster, **kwargs) -> ConnectionSettings:
    kwargs.setdefault("request_timeout", 2)
    return ConnectionSettings(servers=cluster.servers, connect_timeout=2, **kwargs)


async def payloads(conn: JetStreamConnection, stream: str) -> list[bytes]:
    info = await stream_info(conn, stream)
    out: list[bytes] = []
    async for chunk in read_range(conn, stream, 1, int(info["state"]["last_seq"])):
        out.extend(bytes(m[4]) for m in chunk)
    return out


async def kill_leader_when(cluster: EmbeddedNatsCluster, conn: JetStreamConnection, stream: str,
                           ready: Callable[[dict], bool], publisher: Awaitable) -> str:
    """Wait (bounded) until the stream's state satisfies ``ready`` while ``publisher`` runs, then
    SIGKILL the stream leader; returns its name."""
    task = asyncio.ensure_future(publisher)

    async def ready_or_done() -> bool:
        return task.done() or ready((await stream_info(conn, stream))["state"])

    await async_wait_until(ready_or_done, f"stream {stream}'s state to be ready for the leader kill", timeout=20,
                           every=0.01)
    leader = cluster.stream_leader(stream)
    assert leader is not None
    await asyncio.to_thread(cluster.kill, leader)
    return leader


def fast_messages(tag: str, total: int = FAST_TOTAL) -> list[BatchMessage]:
    return [BatchMessage(f"{tag.lower()}.x", b"%s-%06d" % (tag.encode(), i)) for i in range(total)]


def test_fast_batch_rides_out_an_election_without_duplicates(nats_cluster_module: EmbeddedNatsCluster) -> None:
    cluster = nats_cluster_module
    msgs = fast_messages("FASTR")

    async def main():
        async with open_connection(cluster_settings(cluster)) as conn, \
                open_connection(cluster_settings(cluster)) as watcher:
            await ensure_stream(conn, {"name": "FASTR", "subjects": ["fastr.>"], "num_replicas": 3,
                                       "allow_batched": True})
            publisher = publish_fast_batch(conn, msgs)
            task = asyncio.ensure_future(publisher)
            leader = await kill_leader_when(cluster, watcher, "FASTR", lambda s: s["messages"] >= 2000,
                                            asyncio.shield(task))
            try:
                result = await task
            finally:
                await asyncio.to_thread(cluster.restart, leader)
            return result, await payloads(watcher, "FASTR")

    result, stored = asyncio.run(main())
    assert result.count == FAST_TOTAL
    assert stored == [m.data for m in msgs]


def test_fast_batch_cut_by_an_election_reports_what_is_stored(nats_cluster_module: EmbeddedNatsCluster) -> None:
    """With no time to wait for a new leader (leader_wait=0) the batch fails; ``stored`` is the stream's count
    of its messages, they are its first ones, and re-sending the rest leaves the stream exact."""
    cluster = nats_cluster_module
    msgs = fast_messages("FASTC")

    async def main():
        async with open_connection(cluster_settings(cluster, leader_wait=0)) as conn, \
                open_connection(cluster_settings(cluster)) as watcher:
            await ensure_stream(watcher, {"name": "FASTC", "subjects": ["fastc.>"], "num_replicas": 3,
                                          "allow_batched": True})
            task = asyncio.ensure_future(publish_fast_batch(conn, msgs))
            leader = await kill_leader_when(cluster, watcher, "FASTC", lambda s: s["messages"] >= 2000,
                                            asyncio.shield(task))
            try:
                with pytest.raises(FastBatchError) as caught:
                    await task
                in_stream = await payloads(watcher, "FASTC")
                err = caught.value
                resumed = await publish_fast_batch(watcher, msgs[err.stored:])
            finally:
                await asyncio.to_thread(cluster.restart, leader)
            return err, in_stream, resumed, await payloads(watcher, "FASTC")

    err, in_stream, resumed, final = asyncio.run(main())
    assert err.stored is not None and 0 < err.stored < FAST_TOTAL
    assert err.stored == len(in_stream)
    assert in_stream == [m.data for m in msgs[:err.stored]]
    assert err.to_dict()["stored"] == err.stored
    assert resumed.count == FAST_TOTAL - err.stored
    assert final == [m.data for m in msgs]
    assert max(Counter(final).values()) == 1


def stream_state(cluster: EmbeddedNatsCluster, stream: str) -> dict:
    """The stream's state as the first live node that hosts it reports it (monitoring, no client)."""
    for node in cluster.nodes:
        if node.process is None:
            continue
        for account in node.monitor("jsz?accounts=true&streams=true").get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    return detail.get("state") or {}
    return {}


def run_task_with_retries(operator, retries: int, before_retry: Callable[[], None]) -> tuple[dict, list[str]]:
    """Run ``operator.execute`` the way Airflow runs a task with ``retries`` (``before_retry`` plays
    retry_delay); returns the result and the reasons of the failed tries."""
    failures: list[str] = []
    for attempt in range(retries + 1):
        try:
            return operator.execute({}), failures
        except JetStreamError as exc:
            failures.append(exc.reason)
            if attempt == retries:
                raise
            before_retry()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("leader_wait", [30, 0], ids=["client-retries", "task-retries"])
def test_atomic_operator_batches_whole_and_exactly_once_across_a_leader_kill(
    monkeypatch: pytest.MonkeyPatch, nats_cluster_module: EmbeddedNatsCluster, leader_wait: int
) -> None:
    """The stream leader is SIGKILLed while tasks publish. With the default leader_wait the client rides
    out the election; with leader_wait=0 the task fails with leader_unavailable (never
    no_stream_for_subject) and its Airflow retry finishes. Either way every batch is stored whole, once."""
    from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator
    from tests.conftest import set_nats_cluster_connection

    cluster = nats_cluster_module
    name = f"ATOM{leader_wait}"
    set_nats_cluster_connection(monkeypatch, "nats_cluster", cluster, request_timeout=2, leader_wait=leader_wait)

    async def create() -> None:
        async with open_connection(cluster_settings(cluster)) as conn:
            await ensure_stream(conn, {"name": name, "subjects": [f"{name.lower()}.>"], "num_replicas": 3,
                                       "allow_atomic": True})

    asyncio.run(create())
    tasks, per_task, chunk = 5, 1500, 300
    killed: list[str] = []
    missed: list[AssertionError] = []  # the killer thread's wait that timed out, reported by the test

    def kill_mid_run() -> None:
        try:
            wait_until(lambda: stream_state(cluster, name).get("messages", 0) >= per_task + 2 * chunk,
                       f"{name} to hold {per_task + 2 * chunk} messages (then its leader is killed)", timeout=30,
                       every=0.01)
        except AssertionError as exc:
            missed.append(exc)
            return
        leader = cluster.stream_leader(name)
        if leader:
            cluster.kill(leader)
            killed.append(leader)

    def wait_for_leader() -> None:
        wait_until(lambda: cluster.stream_leader(name) not in (None, *killed), f"a new leader of {name}", timeout=30)

    killer = threading.Thread(target=kill_mid_run)
    killer.start()
    results = []
    try:
        for t in range(tasks):
            op = JetStreamAtomicBatchPublishOperator(
                task_id=f"publish_{t}", nats_conn_id="nats_cluster", stream=name, subject=f"{name.lower()}.x",
                messages=[{"data": f"t{t}-{i}"} for i in range(per_task)], split=True, batch_size=chunk,
                dedupe_key=f"{name}-t{t}", retries=3,
            )
            results.append(run_task_with_retries(op, 3, wait_for_leader))
    finally:
        killer.join()
        for node in killed:
            cluster.restart(node)
    assert killed, missed or "the stream leader was expected to be killed mid-run"
    failures = [reason for _, reasons in results for reason in reasons]
    assert "no_stream_for_subject" not in failures
    if leader_wait == 0:
        assert failures and set(failures) <= {"leader_unavailable", "timeout"}, failures

    async def read_back() -> list:
        async with open_connection(cluster_settings(cluster)) as conn:
            info = await stream_info(conn, name)
            out = []
            async for part in read_range(conn, name, 1, int(info["state"]["last_seq"])):
                out.extend(part)
            return out

    stored = asyncio.run(read_back())
    assert Counter(m[4].decode() for m in stored) == Counter(
        f"t{t}-{i}" for t in range(tasks) for i in range(per_task))
    batches: dict[str, list[tuple[int, int]]] = {}
    for _subject, seq, _ts, headers, _data in stored:
        batches.setdefault(headers["Nats-Batch-Id"], []).append((seq, int(headers["Nats-Batch-Sequence"])))
    for batch_id, members in batches.items():
        seqs = [seq for seq, _ in members]
        assert [n for _, n in members] == list(range(1, chunk + 1)), batch_id
        assert seqs == list(range(seqs[0], seqs[0] + chunk)), batch_id
    assert all(result["count"] == per_task for result, _ in results)

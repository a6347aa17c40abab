"""One chaos run: a 3-node cluster, the workloads, the seeded nemesis, then the invariant checker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors

from airflow_jetstream.client import ConnectionSettings
from airflow_jetstream.client.connection import connect
from airflow_jetstream.client.errors import JetStreamError
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.chaos import checker, workloads
from tests.chaos.cluster import NamespacedCluster, resume_all
from tests.chaos.history import History
from tests.chaos.nemesis import Fault, Nemesis, schedule
from tests.chaos.network import NamespaceError, Topology, enter_namespace, enter_namespace_fd

NODES = ["n1", "n2", "n3"]
SETTLE_TIMEOUT = 60.0


@dataclass
class RunConfig:
    seed: int
    faults: int
    kinds: tuple[str, ...]
    workloads: tuple[str, ...] = tuple(workloads.WORKLOADS)
    namespaces: bool = True
    leader_wait: float = 30.0
    warmup: float = 2.0


@dataclass
class RunResult:
    config: RunConfig
    network: str
    report: checker.Report
    faults: list[Fault] = field(default_factory=list)
    seconds: float = 0.0
    t0: float = 0.0  # when the workloads started (fault and op offsets count from here)


def _open_network(config: RunConfig) -> tuple[Topology | None, str]:
    if not config.namespaces:
        return None, "loopback (namespaces not requested): partitions are SIGSTOP"
    try:
        return Topology(NODES).create(), "network namespaces"
    except NamespaceError as exc:
        return None, f"loopback (no network namespaces: {exc}): partitions are SIGSTOP only"


def run(config: RunConfig) -> RunResult:
    """Run once; every process, namespace and directory it made is gone when it returns or raises."""
    started = time.monotonic()
    store = Path(tempfile.mkdtemp(prefix="chaos-"))
    topology, network = _open_network(config)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    cluster: EmbeddedNatsCluster | None = None
    nemesis: Nemesis | None = None
    try:
        if topology is not None:
            enter_namespace(topology.client)
            cluster = NamespacedCluster(topology, store_dir=store / "cluster")
        else:
            cluster = EmbeddedNatsCluster(3, store_dir=store / "cluster", startup_timeout=60)
        cluster.start()
        nemesis = Nemesis(cluster, topology, workloads.fault_streams(config.workloads))
        history = History()
        report = asyncio.run(_drive(config, cluster, nemesis, history))
        return RunResult(config, network, report, nemesis.done, time.monotonic() - started, history.t0)
    finally:
        if nemesis is not None:
            nemesis.halt()
        if cluster is not None:
            resume_all(cluster)
            cluster.close()
        _leave_namespace(home)
        if topology is not None:
            topology.remove()
        shutil.rmtree(store, ignore_errors=True)


def _leave_namespace(home: int) -> None:
    try:
        enter_namespace_fd(home, "of the chaos process")
    finally:
        os.close(home)


async def _drive(config: RunConfig, cluster: EmbeddedNatsCluster, nemesis: Nemesis,
                 history: History) -> checker.Report:
    settings = ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=5,
                                  leader_wait=config.leader_wait)
    await _setup(settings)
    history.t0 = time.monotonic()
    stop = asyncio.Event()
    rng = random.Random(config.seed)
    contexts = [workloads.Context(settings, history, stop, random.Random(rng.random()), config.leader_wait + 60)
                for _ in config.workloads]
    tasks = [asyncio.ensure_future(workloads.run_workload(name, ctx))
             for name, ctx in zip(config.workloads, contexts, strict=True)]
    try:
        await asyncio.sleep(config.warmup)
        await nemesis.run(schedule(config.seed, config.faults, config.kinds))
        await asyncio.sleep(config.warmup)
    finally:
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=config.leader_wait + 90)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    crashed = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
    if crashed:
        raise RuntimeError(f"a workload crashed: {crashed[0]!r}") from crashed[0]
    await asyncio.to_thread(_heal, cluster, nemesis)
    await _settle(settings)
    stored, records = await checker.read_back(cluster.urls)
    report = checker.check(history, stored, records, nemesis, config.leader_wait)
    for stream, states in (await asyncio.to_thread(_diverged_replicas, cluster)).items():
        report.add("diverged", f"{stream}: (messages, first_seq, last_seq) per server {states}")
    return report


async def _setup(settings: ConnectionSettings) -> None:
    """Create the workload streams; bounded retries while the fresh cluster places its first assets."""
    for attempt in range(1, 6):
        try:
            conn = await connect(settings)
            try:
                await workloads.setup(conn)
                return
            finally:
                await conn.close()
        except JetStreamError:
            if attempt == 5:
                raise
            await asyncio.sleep(2)


def _heal(cluster: EmbeddedNatsCluster, nemesis: Nemesis) -> None:
    resume_all(cluster)
    if nemesis.topology is not None:
        for node in cluster.nodes:
            nemesis.topology.heal(node.name)
    for node in cluster.nodes:
        node.start()
    cluster.wait_healthy(90)


async def _settle(settings: ConnectionSettings) -> None:
    """Wait (bounded) until the aggregate has sourced everything left in the WorkQueue origin."""
    conn = await connect(settings)
    try:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(JetStreamError, TimeoutError, nats.errors.Error):
                info = await conn.js.stream_info(workloads.WORKQUEUE)
                if info.state.messages == 0:
                    return
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


def _replica_states(cluster: EmbeddedNatsCluster) -> dict[str, dict[str, tuple[int, int, int]]]:
    """Each workload stream's (messages, first_seq, last_seq) as every server's own replica holds it."""
    states: dict[str, dict[str, tuple[int, int, int]]] = {}
    for node in cluster.nodes:
        jsz = node.monitor("jsz?accounts=true&streams=true")
        for account in jsz.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                state = detail.get("state") or {}
                states.setdefault(detail["name"], {})[node.name] = (
                    state.get("messages", 0), state.get("first_seq", 0), state.get("last_seq", 0))
    return states


def _diverged_replicas(cluster: EmbeddedNatsCluster) -> dict[str, dict[str, tuple[int, int, int]]]:
    """Streams whose replicas still differ after ``SETTLE_TIMEOUT`` s (replicas catch up after a heal)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        diverged = {name: per_node for name, per_node in _replica_states(cluster).items()
                    if name in workloads.CHECKED_REPLICAS and len(set(per_node.values())) > 1}
        if not diverged or time.monotonic() > deadline:
            return diverged
        time.sleep(1)

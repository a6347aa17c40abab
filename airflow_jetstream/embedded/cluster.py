"""An N-node JetStream cluster of real ``nats-server`` processes on loopback (tests, demos, benches).

Example::

    with EmbeddedNatsCluster(size=3) as cluster:
        print(cluster.servers)              # nats://127.0.0.1:p1,nats://127.0.0.1:p2,...
        leader = cluster.stream_leader("ORDERS")
        cluster.kill(leader)                # SIGKILL: the stream elects a new leader in ~5-6 s
        cluster.restart(leader)             # same ports, same store
"""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

from airflow_jetstream.embedded.server import EmbeddedNatsServer, EmbeddedServerError, free_port

CLUSTER_NAME = "jsc"


class ClusterNode(EmbeddedNatsServer):
    """One server of an :class:`EmbeddedNatsCluster`, known by its server ``name``."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = name


class EmbeddedNatsCluster:
    """``size`` JetStream servers named ``n1``..``nN`` with full-mesh routes on 127.0.0.1.

    Each node keeps its JetStream store in ``<store_dir>/<name>``; ``config`` is merged into every
    node's server config, ``jetstream`` into its ``jetstream`` block and ``cluster`` into its ``cluster``
    block (e.g. ``{"no_advertise": True}``). Each node carries the server tag ``node:<name>``, so a test can place a
    stream on one (``"placement": {"tags": ["node:n2"]}``). Leader lookups read the
    monitoring endpoint ``/jsz`` of the live nodes.
    """

    def __init__(self, size: int = 3, *, store_dir: str | Path | None = None, config: dict[str, Any] | None = None,
                 jetstream: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None,
                 startup_timeout: float = 30.0) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._own_dir = store_dir is None
        self.base_dir = Path(store_dir or tempfile.mkdtemp(prefix="nats-cluster-"))
        self.startup_timeout = startup_timeout
        names = [f"n{i}" for i in range(1, size + 1)]
        route_ports = {name: free_port() for name in names}
        self.nodes: list[ClusterNode] = []
        for name in names:
            routes = [f"nats-route://127.0.0.1:{route_ports[other]}" for other in names if other != name]
            node_config = {
                "server_name": name,
                "server_tags": [f"node:{name}"],
                "cluster": {"name": CLUSTER_NAME, "host": "127.0.0.1", "port": route_ports[name],
                            "routes": routes, **(cluster or {})},
                **(config or {}),
            }
            node = ClusterNode(name, store_dir=self.base_dir / name, config=node_config, jetstream=jetstream,
                               startup_timeout=startup_timeout)
            self.nodes.append(node)

    @property
    def urls(self) -> list[str]:
        """Client URLs of all nodes, ``nats://127.0.0.1:PORT``."""
        return [node.url for node in self.nodes]

    @property
    def servers(self) -> str:
        """All client URLs joined with ``,`` (what a ``nats`` connection's host may hold)."""
        return ",".join(self.urls)

    def node(self, name: str) -> ClusterNode:
        """The node called ``name`` (``n1``..``nN``)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r}; nodes are {[n.name for n in self.nodes]}")

    def start(self) -> EmbeddedNatsCluster:
        """Start every node (JetStream only becomes usable once all have met) and wait until healthy."""
        try:
            for node in self.nodes:
                node.start()
            self.wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    def _alive(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def _jsz(self, query: str = "") -> list[dict[str, Any]]:
        """``/jsz`` of every live node that answers."""
        answers = []
        for node in self._alive():
            try:
                answers.append(node.monitor(f"jsz{query}"))
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                continue
        return answers

    def meta_leader(self) -> str | None:
        """The name of the JetStream meta leader, or None while there is none."""
        for jsz in self._jsz():
            leader = (jsz.get("meta_cluster") or {}).get("leader")
            if isinstance(leader, str) and leader:
                return leader
        return None

    def stream_leader(self, stream: str) -> str | None:
        """The node leading ``stream``, or None while it has no leader (or does not exist)."""
        return self.consumer_leader(stream, None)

    def consumer_leader(self, stream: str, consumer: str | None) -> str | None:
        """The node leading ``consumer`` on ``stream`` (with None: the stream), or None while it has none."""
        query = "?accounts=true&streams=true" + ("&consumers=true" if consumer else "")
        for jsz in self._jsz(query):
            for account in jsz.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    if detail.get("name") != stream:
                        continue
                    holders = [detail] if consumer is None else [
                        info for info in detail.get("consumer_detail") or [] if info.get("name") == consumer]
                    for holder in holders:
                        leader = (holder.get("cluster") or {}).get("leader")
                        if isinstance(leader, str) and leader:
                            return leader
        return None

    def kill(self, name: str) -> None:
        """SIGKILL node ``name`` (its store and ports stay for :meth:`restart`)."""
        self.node(name).stop(kill=True)

    def restart(self, name: str) -> None:
        """Start node ``name`` again on the same ports and store, then wait until the cluster is healthy."""
        self.node(name).start()
        self.wait_healthy()

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait (bounded) until every node answers, has routes to all others and a meta leader exists."""
        limit = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        problem: str | None = "not checked"
        while time.monotonic() < deadline:
            problem = self._health_problem()
            if problem is None:
                return
            time.sleep(0.1)
        raise EmbeddedServerError(f"cluster not healthy after {limit}s: {problem}")

    def _health_problem(self) -> str | None:
        peers = len(self.nodes) - 1
        for node in self.nodes:
            name = node.name
            if node.process is None or node.process.poll() is not None:
                return f"{name} is not running"
            try:
                routed = {r.get("remote_name") for r in node.monitor("routez").get("routes") or []}
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
                return f"{name} monitoring does not answer: {exc}"
            if len(routed - {None}) < peers:
                return f"{name} has routes to {sorted(routed - {None})}, expected {peers} peers"
        leaders = {(jsz.get("meta_cluster") or {}).get("leader") for jsz in self._jsz()}
        leader = leaders.pop() if len(leaders) == 1 else None
        if not isinstance(leader, str) or not leader:
            return f"no agreed JetStream meta leader yet (seen: {sorted(map(str, leaders | {leader}))})"
        try:
            meta = self.node(leader).monitor("jsz").get("meta_cluster") or {}
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
            return f"the meta leader's monitoring does not answer: {exc}"
        lagging = [r.get("name") for r in meta.get("replicas") or [] if not r.get("current")]
        if lagging:
            return f"meta peers {lagging} are not current yet"
        return None

    def close(self) -> None:
        """Stop all nodes and remove the store directory if the cluster made it."""
        for node in self.nodes:
            node.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

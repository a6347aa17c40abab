"""The cluster under test: the embedded 3-node cluster, on loopback or one server per network namespace."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from airflow_jetstream.embedded.cluster import CLUSTER_NAME, ClusterNode, EmbeddedNatsCluster
from tests.chaos.network import Topology

CLIENT_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222


class NamespacedNode(ClusterNode):
    """A cluster node whose process runs in its own network namespace (``ip netns exec``)."""

    def __init__(self, name: str, namespace: str, address: str, **kwargs: Any) -> None:
        super().__init__(name, port=CLIENT_PORT, **kwargs)
        self.namespace = namespace
        self.address = address
        self.monitor_port = MONITOR_PORT

    @property
    def url(self) -> str:
        return f"nats://{self.address}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.address}:{self.monitor_port}"

    def _spawn(self) -> None:
        # `ip netns exec` execs the server in place, so the process id is the server's own.
        self.write_config()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, self.binary, "-c", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )


class NamespacedCluster(EmbeddedNatsCluster):
    """An :class:`EmbeddedNatsCluster` whose nodes live in the namespaces of ``topology``.

    Routes run on the route network, clients and monitoring on the client network, so the
    topology can partition a node from its peers only.
    """

    def __init__(self, topology: Topology, *, store_dir: Path, config: dict[str, Any] | None = None,
                 startup_timeout: float = 60.0) -> None:
        super().__init__(len(topology.node_names), store_dir=store_dir, startup_timeout=startup_timeout)
        self.topology = topology
        self.nodes = []
        for name in topology.node_names:
            routes = [f"nats-route://{topology.route_address(other)}:{ROUTE_PORT}"
                      for other in topology.node_names if other != name]
            address = topology.address(name)
            node_config = {
                "server_name": name,
                "host": address,
                "http": f"{address}:{MONITOR_PORT}",
                "cluster": {"name": CLUSTER_NAME, "host": topology.route_address(name), "port": ROUTE_PORT,
                            "routes": routes},
                **(config or {}),
            }
            self.nodes.append(NamespacedNode(name, topology.namespace(name), address,
                                             store_dir=self.base_dir / name, config=node_config,
                                             startup_timeout=startup_timeout))


def pid_of(cluster: EmbeddedNatsCluster, name: str) -> int | None:
    """The process id of node ``name`` while it runs (only processes this suite started)."""
    process = cluster.node(name).process
    return process.pid if process is not None and process.poll() is None else None


def signal_node(cluster: EmbeddedNatsCluster, name: str, sig: signal.Signals) -> bool:
    """Send ``sig`` to node ``name``'s server process; False when it does not run."""
    pid = pid_of(cluster, name)
    if pid is None:
        return False
    os.kill(pid, sig)
    return True


def resume_all(cluster: EmbeddedNatsCluster) -> None:
    """SIGCONT every running node (a stopped server would ignore the SIGTERM of a clean-up)."""
    for node in cluster.nodes:
        signal_node(cluster, node.name, signal.SIGCONT)

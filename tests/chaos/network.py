"""Network namespaces for the chaos suite: one per server, one for the client, a hub with two bridges.

Each server ``nK`` gets two veth links into the hub namespace: ``eth0`` on the client bridge
(10.77.1.1K, clients and monitoring) and ``eth1`` on the route bridge (10.77.2.1K, cluster routes).
The chaos process itself enters the client namespace (10.77.1.2). Taking a server's hub-side links
down partitions it; taking only its route link down cuts it off its peers while clients still reach it.
Every name carries the creating process id, so concurrent runs never meet; :meth:`Topology.remove`
deletes everything, and nothing of it exists outside the namespaces.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterable

CLONE_NEWNET = 0x40000000
CLIENT_NET = "10.77.1"
ROUTE_NET = "10.77.2"
CLIENT_ADDRESS = f"{CLIENT_NET}.2"


class NamespaceError(RuntimeError):
    """A namespace, link or address could not be made (not root, no ``ip``, no kernel support)."""


def ip(*args: str) -> None:
    """Run ``ip ARGS`` and raise :class:`NamespaceError` with its stderr when it fails."""
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"ip {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def enter_namespace(name: str) -> None:
    """Move the calling thread (and the threads it starts later) into network namespace ``name``."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        enter_namespace_fd(fd, name)
    finally:
        os.close(fd)


def enter_namespace_fd(fd: int, name: str) -> None:
    """Move the calling thread into the network namespace open as ``fd`` (e.g. ``/proc/self/ns/net``)."""
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise NamespaceError(f"setns {name}: {os.strerror(ctypes.get_errno())}")


class Topology:
    """The namespaces and links of one chaos run (see the module docstring)."""

    def __init__(self, node_names: Iterable[str], tag: str | None = None, *, prefix: str = "chaos",
                 route_net: bool = True) -> None:
        self.tag = tag or str(os.getpid())
        self.prefix = prefix  # of every namespace name: another suite's runs never meet this one's
        self.route_net = route_net  # False: one link per node (the client bridge) and no route bridge
        self.node_names = list(node_names)
        self.hub = f"{prefix}-{self.tag}-hub"
        self.client = f"{prefix}-{self.tag}-c"
        self.made: list[str] = []

    def namespace(self, node: str) -> str:
        return f"{self.prefix}-{self.tag}-{node}"

    def address(self, node: str) -> str:
        """The server's client (and monitoring) address."""
        return f"{CLIENT_NET}.{10 + self._index(node)}"

    def route_address(self, node: str) -> str:
        return f"{ROUTE_NET}.{10 + self._index(node)}"

    def _index(self, node: str) -> int:
        return self.node_names.index(node) + 1

    def _hub_link(self, net: str, node: str) -> str:
        return f"cj{self.tag}{net}{self._index(node)}"

    def create(self) -> Topology:
        """Make the namespaces, bridges and links; on any failure remove what was made and raise."""
        try:
            self._add_namespace(self.hub)
            for bridge in ("brc", "brr") if self.route_net else ("brc",):
                ip("-n", self.hub, "link", "add", bridge, "type", "bridge")
                ip("-n", self.hub, "link", "set", bridge, "up")
            self._add_namespace(self.client)
            self._link(self.client, f"cj{self.tag}c0", "brc", "eth0", f"{CLIENT_ADDRESS}/24")
            for node in self.node_names:
                ns = self.namespace(node)
                self._add_namespace(ns)
                self._link(ns, self._hub_link("c", node), "brc", "eth0", f"{self.address(node)}/24")
                if self.route_net:
                    self._link(ns, self._hub_link("r", node), "brr", "eth1", f"{self.route_address(node)}/24")
        except BaseException:
            self.remove()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self.made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _link(self, ns: str, hub_end: str, bridge: str, inner: str, cidr: str) -> None:
        ip("-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", inner, "netns", ns)
        ip("-n", self.hub, "link", "set", hub_end, "master", bridge)
        ip("-n", self.hub, "link", "set", hub_end, "up")
        ip("-n", ns, "addr", "add", cidr, "dev", inner)
        ip("-n", ns, "link", "set", inner, "up")

    def cut(self, node: str, *, routes_only: bool = False) -> None:
        """Partition ``node``: from everyone, or (``routes_only``) only from the other servers."""
        nets = ("r",) if routes_only else ("c", "r") if self.route_net else ("c",)
        for net in nets:
            ip("-n", self.hub, "link", "set", self._hub_link(net, node), "down")

    def heal(self, node: str) -> None:
        for net in ("c", "r") if self.route_net else ("c",):
            ip("-n", self.hub, "link", "set", self._hub_link(net, node), "up")

    def remove(self) -> list[str]:
        """Delete every namespace this topology made (their links go with them); returns the failures."""
        failures = []
        for name in reversed(self.made):
            try:
                ip("netns", "del", name)
            except NamespaceError as exc:
                failures.append(str(exc))
        self.made.clear()
        return failures


def leftover_namespaces(tag: str, prefix: str = "chaos") -> list[str]:
    """Namespaces of run ``tag`` that still exist (a clean run leaves none)."""
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(f"{prefix}-{tag}-"))


def remove_leftovers(tag: str, prefix: str = "chaos") -> None:
    """Delete the namespaces of run ``tag`` (a run killed before its own clean-up)."""
    for name in leftover_namespaces(tag, prefix):
        ip("netns", "del", name)

"""Hosts on one machine: each a network namespace with its own address, its own directories and its own ``/tmp``.

The namespaces and their bridge are :class:`tests.chaos.network.Topology`'s (one link per host, prefix
``hosts``): host ``db`` is 10.77.1.11, ``ctl`` .12, ``w1`` .13, ``w2`` .14, ``edge`` .15, and the controller (the
process that starts everything, ``make up-hosts`` or the tests) enters the client namespace, 10.77.1.2. Nothing of
it exists outside the namespaces. A process started on a host (:meth:`Host.spawn`, :meth:`Host.command`) runs in
the host's network namespace and in a mount namespace of its own (private: nothing mounted elsewhere later reaches
it) where the whole filesystem of the machine is read-only except what :meth:`Host.writable` names:

- ``<root>/private/<host>``, the host's disk (its home, its logs, its servers' data);
- ``<root>/etc``, the host's own ``<root>/private/<host>/etc``: the same path on every host, as ``/etc/airflow`` is
  on real ones (the connection names files there: each host gets its own copy);
- ``/tmp``, the host's ``<root>/private/<host>/tmp`` (code under ``/tmp``, a checkout there, is bound into it
  read-only at its own path; a root under ``/tmp`` would be hidden by it: then only ``TMPDIR`` points there and
  ``/tmp`` is read-only);
- ``/dev/shm``, the host's ``<root>/private/<host>/shm`` (POSIX shared memory and semaphores: PostgreSQL's dynamic
  shared memory, the Celery worker's pool);
- ``<root>/shared`` on the hosts given it: the shared volume (the object store of a real deployment).

The other hosts' private directories, the controller's ``<root>/control`` and, on the hosts not given it, the
shared volume are hidden (an empty read-only directory is mounted over each). So a file a host reads was in the
machine's read-only image before the deployment started, or written by that host itself, or on the shared volume
of the hosts given it: a host cannot rely on a file another host wrote, and a secret can only land on the disks of
the hosts that handle it (``tests/test_hosts_deployment.py`` checks the mounts from inside each host and scans each
host's writable directories for secrets).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.chaos.network import (
    CLIENT_ADDRESS,
    CLIENT_NET,
    NamespaceError,
    Topology,
    enter_namespace,
    enter_namespace_fd,
    ip,
    leftover_namespaces,
    remove_leftovers,
)

PREFIX = "hosts"
NETWORK = f"{CLIENT_NET}.0/24"
#: The hosts of the tested topology (docs/deployment.md, "Celery across hosts").
HOST_NAMES = ("db", "ctl", "w1", "w2", "edge")
REPO = Path(__file__).resolve().parents[2]
#: The installed code every host shares read-only (with the rest of the machine's files).
CODE = (Path(sys.prefix), REPO / "airflow_jetstream", REPO / "dags_examples", REPO / "tests")
#: Makes every mount of the calling mount namespace that is writable read-only (a bind remount changes this
#: namespace's view only, not the filesystem; mounts already read-only are left as they are).
READ_ONLY_EVERYTHING = ("awk '$6 ~ /^rw(,|$)/ {print $5}' /proc/self/mountinfo | while read -r point; do "
                        'mount -o remount,bind,ro "$point" || exit 1; done')
#: The first ``ip rule`` priority of a fault (:meth:`Host.block`); the kernel's own rules are 0 and 32766+.
RULE_PRIORITY = 1000


class HostError(RuntimeError):
    """A host could not be made, or a process on it not started; the message names the host and the cause."""


def host_address() -> str:
    """``[core] hostname_callable`` of every Airflow component on a host: its address, where the api-server
    fetches a task's log from (the hosts share one kernel host name)."""
    return os.environ["HOSTS_ADDRESS"]


def namespaces_unavailable() -> str | None:
    """Why hosts cannot be made on this machine (not root, no ``ip``, no network namespaces), or None."""
    if os.geteuid() != 0:
        return "not root: network namespaces (ip netns add) need root"
    if shutil.which("ip") is None:
        return "no `ip` command: install iproute2"
    probe = Topology([], tag=f"p{os.getpid()}", prefix=PREFIX, route_net=False)
    try:
        probe.create()
    except NamespaceError as exc:
        return f"network namespaces do not work here: {exc}"
    finally:
        probe.remove()
    return None


def _under_tmp(path: Path) -> bool:
    return path.resolve().is_relative_to("/tmp")


class Host:
    """One host: its namespace, address and private directory, and the processes started on it."""

    def __init__(self, name: str, namespace: str, address: str, root: Path, *, others: list[str],
                 shared: bool, code: tuple[Path, ...] = CODE) -> None:
        self.name = name
        self.namespace = namespace
        self.address = address
        self.root = root
        self.private = root / "private" / name
        self.others = others
        self.shared = shared
        self.private_tmp = not _under_tmp(root)
        #: the code under /tmp (a checkout there): bound read-only into the host's own /tmp at the same paths
        self.code_in_tmp = [path.resolve() for path in code if _under_tmp(path)]
        self._rules: list[int] = []

    @property
    def tmp(self) -> Path:
        """``/tmp`` as the host's processes see it."""
        return Path("/tmp") if self.private_tmp else self.private / "tmp"

    @property
    def etc(self) -> Path:
        """The host's configuration files as its processes see them (written at :meth:`own_etc`)."""
        return self.root / "etc"

    @property
    def own_etc(self) -> Path:
        """Where the controller writes the host's configuration files (seen by it at :attr:`etc`)."""
        return self.private / "etc"

    def prepare(self) -> None:
        for folder in ("tmp", "shm", "etc", "logs", "home"):
            (self.private / folder).mkdir(parents=True, exist_ok=True)
        self.private.chmod(0o711)  # the database host's server runs as the postgres user
        for shared_by_users in ("tmp", "shm"):
            (self.private / shared_by_users).chmod(0o1777)
        for code in self.code_in_tmp if self.private_tmp else []:
            (self.private / "tmp" / code.relative_to("/tmp")).mkdir(parents=True, exist_ok=True)

    def writable(self) -> dict[Path, Path]:
        """Where the host's processes may write (the module docstring): each path as they see it -> the directory
        the controller sees there (its disk, under :attr:`private`, or the shared volume)."""
        places = {self.private: self.private, self.etc: self.own_etc}
        if self.private_tmp:
            places[Path("/tmp")] = self.private / "tmp"
        places[Path("/dev/shm")] = self.private / "shm"
        if self.shared:
            places[self.root / "shared"] = self.root / "shared"
        return places

    def hidden(self) -> list[Path]:
        """What the host sees as an empty read-only directory: the other hosts' disks, the controller's files and
        the shared volume where not given it."""
        hidden = [self.root / "control", *(self.root / "private" / other for other in self.others)]
        return hidden if self.shared else [*hidden, self.root / "shared"]

    def mounts(self) -> list[str]:
        """The shell commands making the host's view of the files (see the module docstring): nothing mounted
        elsewhere reaches it, every mount read-only, then the hidden and the writable places bound over it."""
        commands = ["mount --make-rprivate /", READ_ONLY_EVERYTHING]

        def bind(source: Path, target: Path, mode: str, bind: str = "bind") -> None:
            src, dst = shlex.quote(str(source)), shlex.quote(str(target))  # a bind keeps its source's flags: remount
            commands.extend([f"mount --{bind} {src} {dst}", f"mount -o remount,bind,{mode} {dst}"])

        for hidden in self.hidden():
            bind(self.root / "empty", hidden, "ro")
        for seen, source in self.writable().items():
            if seen == Path("/tmp"):  # the code under /tmp first into the host's /tmp, then that over /tmp with it
                for code in self.code_in_tmp:
                    bind(code, source / code.relative_to("/tmp"), "ro")
                bind(source, seen, "rw", "rbind")
            else:
                bind(source, seen, "rw")
        return commands

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host: in its network namespace, with its view of the files, in its private
        directory (where a process writes what it writes to its working directory)."""
        script = " && ".join([*self.mounts(), f"cd {shlex.quote(str(self.private))}", 'exec "$@"'])
        return ["ip", "netns", "exec", self.namespace, "sh", "-c", script, "sh", *argv]

    def variables(self) -> dict[str, str]:
        """The environment that makes a process this host's: TMPDIR, HOME and the address."""
        return {"TMPDIR": str(self.tmp), "HOME": str(self.private / "home"), "HOSTS_ADDRESS": self.address,
                "PYTHONDONTWRITEBYTECODE": "1"}  # the code is read-only

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with :meth:`variables`."""
        return {**(os.environ if base is None else base), **self.variables()}

    def spawn(self, key: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host in its own session, its output in ``private/logs/<key>.log``."""
        with (self.private / "logs" / f"{key}.log").open("ab") as out:
            try:
                return subprocess.Popen(self.command(argv), env=self.env(env), stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                raise HostError(f"host {self.name}: cannot start {argv[0]}: {exc}") from exc

    def log_tail(self, key: str, chars: int = 3000) -> str:
        path = self.private / "logs" / f"{key}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def pids(self) -> list[int]:
        """Every process in the host's network namespace."""
        done = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True, check=False)
        return [int(pid) for pid in done.stdout.split()]

    def kill(self) -> list[int]:
        """SIGKILL every process on the host (a host that loses power); returns their ids."""
        killed = self.pids()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return killed

    def block(self, *, to: str = NETWORK, ports: tuple[int, ...] = ()) -> None:
        """Drop the host's traffic with ``to`` (an address or network): only TCP to or from ``ports`` when given
        (the host is cut off from those services, in both directions), else all of it. Its own addresses
        still answer it (the kernel's local table comes first). :meth:`heal` removes every block."""
        selectors = [["dport", str(port)] for port in ports] + [["sport", str(port)] for port in ports]
        for selector in selectors or [[]]:
            priority = RULE_PRIORITY + len(self._rules)
            protocol = ["ipproto", "tcp"] if selector else []
            ip("-n", self.namespace, "rule", "add", "priority", str(priority), "to", to, *protocol, *selector,
               "blackhole")
            self._rules.append(priority)

    def heal(self) -> None:
        for priority in self._rules:
            ip("-n", self.namespace, "rule", "del", "priority", str(priority))
        self._rules.clear()


class Hosts:
    """The namespaces, addresses and directories of :data:`HOST_NAMES` under ``root``; ``shared`` names the
    hosts that mount the shared volume ``root/shared``."""

    def __init__(self, root: Path, *, names: tuple[str, ...] = HOST_NAMES, shared: tuple[str, ...] = (),
                 tag: str | None = None, code: tuple[Path, ...] = CODE) -> None:
        self.root = Path(root).resolve()
        self.topology = Topology(names, tag, prefix=PREFIX, route_net=False)
        self.hosts = {name: Host(name, self.topology.namespace(name), self.topology.address(name), self.root,
                                 others=[other for other in names if other != name], shared=name in shared,
                                 code=code)
                      for name in names}

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def client_address(self) -> str:
        return CLIENT_ADDRESS

    def create(self) -> Hosts:
        """Make the directories and namespaces; namespaces left by a run that was killed are removed first."""
        remove_stale()
        for folder in ("empty", "control", "shared", "etc"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)
        (self.root / "private").mkdir(mode=0o711, exist_ok=True)
        for host in self.hosts.values():
            host.prepare()
        try:
            self.topology.create()
        except NamespaceError as exc:
            raise HostError(f"cannot make the hosts' network namespaces: {exc}") from exc
        return self

    @contextlib.contextmanager
    def client(self) -> Iterator[None]:
        """Run the calling thread (and the threads it starts) in the client namespace, so that it reaches the hosts'
        addresses, and return it to the namespace it was in afterwards."""
        original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            enter_namespace(self.topology.client)
            yield
        finally:
            enter_namespace_fd(original, "the original network namespace")
            os.close(original)

    def remove(self) -> list[str]:
        """Kill whatever still runs on the hosts and delete the namespaces; returns what could not be removed."""
        for host in self.hosts.values():
            host.kill()
        return self.topology.remove()


def remove_stale() -> None:
    """Delete the namespaces of runs whose process is gone (a run killed before its clean-up), with what runs there."""
    with contextlib.suppress(FileNotFoundError):
        for tag in {name.split("-")[1] for name in os.listdir("/run/netns") if name.startswith(f"{PREFIX}-")}:
            if tag.isdigit() and not Path(f"/proc/{tag}").exists():
                for name in leftover_namespaces(tag, PREFIX):
                    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
                    for pid in done.stdout.split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                remove_leftovers(tag, PREFIX)

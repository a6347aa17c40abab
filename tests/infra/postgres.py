"""A PostgreSQL cluster in a directory, from the machine's PostgreSQL binaries, for a local Airflow.

It listens on 127.0.0.1 and on a unix socket inside its directory; the ``airflow`` role has a
random password kept in the directory (mode 600). PostgreSQL refuses to run as root, so as root
the cluster belongs to the ``postgres`` user (``runuser``). A second :meth:`EmbeddedPostgres.start`
on the same directory reuses the cluster (and a server still running from before)::

    with EmbeddedPostgres(Path(".up/postgres")) as pg:
        print(pg.sqlalchemy_url)   # postgresql+psycopg2://airflow:...@127.0.0.1:<port>/airflow
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from airflow_jetstream.embedded.server import free_port

#: Where Debian's ``postgresql`` package puts each major version's binaries.
DEBIAN_BIN_DIRS = "/usr/lib/postgresql"
SERVICE_USER = "postgres"
ROLE = DATABASE = "airflow"


class EmbeddedPostgresError(RuntimeError):
    """The PostgreSQL binaries are missing or the cluster did not start; the message says why and what to do."""


def find_postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding ``initdb`` (``POSTGRES_BIN_DIR`` names another)."""
    override = os.environ.get("POSTGRES_BIN_DIR")
    if override:
        return Path(override) if (Path(override) / "initdb").is_file() else None
    found = [p.parent for p in Path(DEBIAN_BIN_DIRS).glob("*/bin/initdb")]
    found.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


def install_postgres_binaries() -> Path:
    """Install Debian's ``postgresql`` package (as root, with apt-get) when no binaries are found."""
    bin_dir = find_postgres_bin_dir()
    if bin_dir is not None:
        return bin_dir
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EmbeddedPostgresError("no PostgreSQL binaries in /usr/lib/postgresql/*/bin: install Debian's "
                                    "postgresql package (apt-get install postgresql) or set POSTGRES_BIN_DIR")
    failure = apt_install("postgresql")
    if failure:
        raise EmbeddedPostgresError(failure)
    bin_dir = find_postgres_bin_dir()
    if bin_dir is None:
        raise EmbeddedPostgresError("apt-get installed postgresql but no initdb is in /usr/lib/postgresql/*/bin")
    return bin_dir


def apt_install(package: str) -> str | None:
    """Install Debian's ``package`` with apt-get (``apt-get update`` first when the lists are stale); None when it
    worked, else what failed with the tail of apt-get's output."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", package]
    if subprocess.run(command, env=env, capture_output=True, check=False).returncode == 0:
        return None
    subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"apt-get install {package} failed (exit {done.returncode}): {(done.stdout + done.stderr)[-1500:]}"
    return None


def _reachable_by(path: Path, uid: int) -> bool:
    """Whether ``uid`` (not the owner) can traverse every directory above ``path``."""
    for parent in path.resolve().parents:
        mode = parent.stat()
        if mode.st_uid != uid and not mode.st_mode & stat.S_IXOTH:
            return False
    return True


class EmbeddedPostgres:
    """A PostgreSQL cluster under ``root`` (``data/``, ``socket/``, ``server.log``, ``password``, ``port``).

    :param root: the cluster's directory (created). Its parents must be traversable by the ``postgres``
        user when running as root.
    :param port: the TCP port (default: the one used last time if free, else a free one).
    :param host: the address it listens on and is reached at.
    :param clients: a network (``10.77.1.0/24``) whose hosts may log in with the password, beside the loopback.
    :param command_prefix: runs every PostgreSQL tool (so the server too) under it, e.g. ``ip netns exec NAME``.
    """

    def __init__(self, root: Path, *, port: int | None = None, host: str = "127.0.0.1", clients: str | None = None,
                 command_prefix: tuple[str, ...] = ()) -> None:
        self.root = Path(root).resolve()
        self.host = host
        self.clients = clients
        self.command_prefix = command_prefix
        self.bin_dir = install_postgres_binaries()
        self._as_root = os.geteuid() == 0
        self.port = port or self._last_port()
        self.password = self._password()

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    @property
    def sqlalchemy_url(self) -> str:
        """What ``[database] sql_alchemy_conn`` is set to (it holds the password: never print it)."""
        return f"postgresql+psycopg2://{ROLE}:{self.password}@{self.host}:{self.port}/{DATABASE}"

    def _last_port(self) -> int:
        saved = self.root / "port"
        if saved.exists() and saved.read_text().strip().isdigit():
            return int(saved.read_text())
        return free_port()

    def _password(self) -> str:
        saved = self.root / "password"
        if saved.exists():
            return saved.read_text().strip()
        self.root.mkdir(parents=True, exist_ok=True)
        password = secrets.token_urlsafe(18)
        saved.write_text(password)
        saved.chmod(0o600)
        return password

    def _run(self, tool: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL tool (as the ``postgres`` user when we are root); raise with its output on failure."""
        command = [str(self.bin_dir / tool), *args]
        if self._as_root:
            command = ["runuser", "-u", SERVICE_USER, "--", *command]
        command = [*self.command_prefix, *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120,
                              env={**os.environ, **(env or {})}, cwd=self.root)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-2000:]
            raise EmbeddedPostgresError(f"{tool} failed (exit {done.returncode}): {output}")
        return done

    def _own(self, *paths: Path) -> None:
        if self._as_root:
            user = pwd.getpwnam(SERVICE_USER)
            for path in paths:
                os.chown(path, user.pw_uid, user.pw_gid)

    def _init(self) -> None:
        """``initdb`` with the ``airflow`` role (scram password), then the ``airflow`` database."""
        if self._as_root and not _reachable_by(self.root, pwd.getpwnam(SERVICE_USER).pw_uid):
            raise EmbeddedPostgresError(f"the {SERVICE_USER} user cannot reach {self.root} (a parent directory is "
                                        "closed to others); choose a directory under one it can traverse")
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password)
        pwfile.chmod(0o600)
        self.data_dir.mkdir(mode=0o700)
        self._own(pwfile, self.data_dir)
        try:
            self._run("initdb", "-D", str(self.data_dir), "-U", ROLE, "--pwfile", str(pwfile),
                      "--auth", "scram-sha-256", "-E", "UTF8", "--locale", "C")
        finally:
            pwfile.unlink()
        if self.clients:
            with (self.data_dir / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.clients} scram-sha-256\n")

    def running_port(self) -> int | None:
        """The port of a server still running on this cluster (its ``postmaster.pid``), else None."""
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.exists():
            return None
        lines = pid_file.read_text().splitlines()
        try:
            os.kill(int(lines[0]), 0)
        except (ProcessLookupError, ValueError, IndexError):
            return None
        return int(lines[3]) if len(lines) > 3 and lines[3].isdigit() else None

    def start(self) -> EmbeddedPostgres:
        """Create the cluster (first time), start the server (unless it runs) and create the database."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)  # a half-made cluster from an interrupted start
            self._init()
        running = self.running_port()
        if running is not None:
            self.port = running
        else:
            self.socket_dir.mkdir(exist_ok=True)
            self._own(self.root, self.socket_dir)
            if self.host == "127.0.0.1" and not port_free(self.port):
                self.port = free_port()
            options = (f"-p {self.port} -c listen_addresses={self.host} -c unix_socket_directories={self.socket_dir} "
                       "-c max_connections=200")
            self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.root / "server.log"), "-o", options,
                      "-w", "-t", "120", "start")
        (self.root / "port").write_text(str(self.port))
        env = {"PGPASSWORD": self.password}
        target = ["-h", self.host, "-p", str(self.port), "-U", ROLE]
        exists = self._run("psql", *target, "-d", "postgres", "-tAc",
                           f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'", env=env).stdout.strip()
        if not exists:
            self._run("createdb", *target, DATABASE, env=env)
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are ended); the cluster stays for the next start."""
        if self.running_port() is not None:
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop")

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@contextlib.contextmanager
def temporary_postgres(prefix: str = "airflow-pg-") -> Iterator[EmbeddedPostgres]:
    """A running cluster in a new directory under the temp dir, stopped and removed on exit.

    The directory is mode 711 so that, as root, the ``postgres`` user that owns the cluster reaches it.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)
    pg = EmbeddedPostgres(root / "postgres")
    try:
        yield pg.start()
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` of 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


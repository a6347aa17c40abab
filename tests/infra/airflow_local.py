"""A local Airflow deployment on loopback: api-server, scheduler, dag-processor and triggerer.

Every component is a separate ``airflow`` process (LocalExecutor, one Airflow home; the metadata
database is sqlite in the home or ``database_url``, e.g. an :class:`EmbeddedPostgres`), bound to
127.0.0.1, with log servers skipped (``--skip-serve-logs``: the api-server reads the local log
files). ``make up`` runs :func:`main` (PostgreSQL in ``.up/postgres``); the deployment tests drive
:class:`LocalAirflow` directly::

    with EmbeddedNatsServer() as nats, LocalAirflow(home, nats_url=nats.url, dags_folder=dags) as af:
        af.start()                     # all four components, waits until the api-server is healthy
        print(af.url, af.user, af.password)
        af.stop("triggerer", signal.SIGTERM); af.start_component("triggerer")
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy

from airflow_jetstream.embedded.server import free_port
from tests.infra.postgres import EmbeddedPostgres, EmbeddedPostgresError, port_free
from tests.infra.supervise import StopRequest, serve

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
#: ``[logging] worker_log_server_port`` (Airflow's default), where the api-server reads a worker's task logs.
WORKER_LOG_SERVER_PORT = 8793
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: A component that exits this many times within CRASH_LOOP_WINDOW seconds is not restarted again.
CRASH_LOOP_RESTARTS, CRASH_LOOP_WINDOW = 5, 300.0
#: Seconds a stopped component gets to exit on its own (the triggerer gives its triggers 10 s to close).
STOP_TIMEOUT = 60.0
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
#: ``make up``'s ports: the variable that sets one, the first choice (Airflow's and NATS's usual ones), what it is.
#: The API's signing secrets in the home, kept across starts like the password.
API_SECRETS = "api-secrets.json"
UP_PORTS = {"api-server": ("UP_PORT", 8080, "the Airflow UI"), "nats-server": ("UP_NATS_PORT", 4222, "nats-server")}


def component_hostname() -> str:
    """``[core] hostname_callable`` of a triggerer here: the host name and the component's key
    (``host/triggerer-2``), stored in its job row."""
    return f"{socket.getfqdn()}/{os.environ.get('LOCAL_AIRFLOW_COMPONENT', 'airflow')}"


def write_private(path: Path, content: dict[str, Any]) -> None:
    """Write ``content`` as JSON into ``path``, readable by its owner only (mode 600 before the secret is in it)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(json.dumps(content))


class LocalAirflowError(RuntimeError):
    """A component of the local deployment did not start or exited; the message holds its log tail."""


def nats_connection(url: str, extra: dict[str, Any] | None = None,
                    login: tuple[str, str] | None = None) -> dict[str, Any]:
    """The ``nats_default`` connection for a ``nats://host:port`` (or comma-separated) server URL and an optional
    ``(user, password)``."""
    hosts = [part.split("://", 1)[-1] for part in url.split(",")]
    conn: dict[str, Any] = {"conn_type": "nats", "host": ",".join(hosts)}
    if login:
        conn.update(login=login[0], password=login[1])
    if len(hosts) == 1:
        host, port = hosts[0].rsplit(":", 1)
        conn.update(host=host, port=int(port))
    return {**conn, "extra": extra} if extra else conn


class LocalAirflow:
    """Airflow's four components as subprocesses sharing one home and metadata database.

    :param home: the Airflow home (created; holds ``logs/``, one log per component and, by default,
        the sqlite database ``airflow.db``).
    :param nats_url: the nats-server the ``nats_default`` connection points at.
    :param dags_folder: the DAGs to load.
    :param port: the api-server port on 127.0.0.1 (default: a free one).
    :param password: the ``admin`` user's password (default: ``AIRFLOW_UP_PASSWORD``, else the one stored in
        ``home/passwords.json`` by an earlier start, else a random one); stored there (mode 600) on start.
        The API's signing secrets (``[api_auth] jwt_secret``, ``[api] secret_key``) are kept the same way, in
        ``home/api-secrets.json``: a restart keeps browsers and API clients logged in.
    :param connections_in_db: store ``nats_default``/``spark_default`` in the database (visible and
        testable in the UI) instead of ``AIRFLOW_CONN_*`` variables.
    :param nats_extra: the ``extra`` of ``nats_default`` (credentials such as ``nkey_seed_secret``, timeouts).
    :param nats_login: ``nats_default``'s user and password.
    :param extra_env: more environment (``AIRFLOW__SECTION__KEY`` settings, ``JETSTREAM_*``).
    :param database_url: the metadata database (``[database] sql_alchemy_conn``); default sqlite in ``home``.
    :param host: the address the api-server binds and the components reach it at (``tests/infra/hosts.py``: a
        network namespace's own address).
    :param spark_master: the ``spark_default`` connection's master (client deploy mode).
    :param launch: wraps each component's command, e.g. to run it inside a network namespace.
    """

    user = "admin"

    def __init__(self, home: Path, *, nats_url: str, dags_folder: Path, port: int | None = None,
                 password: str | None = None, connections_in_db: bool = False,
                 nats_extra: dict[str, Any] | None = None, nats_login: tuple[str, str] | None = None,
                 extra_env: dict[str, str] | None = None,
                 database_url: str | None = None, host: str = "127.0.0.1", spark_master: str = "local[2]",
                 launch: Callable[[list[str]], list[str]] | None = None) -> None:
        self.home = Path(home).resolve()
        self.host = host
        self.spark_connection = {"conn_type": "spark", "host": spark_master, "extra": {"deploy-mode": "client"}}
        self.launch = launch or (lambda command: command)
        self.database_url = database_url or f"sqlite:///{self.home / 'airflow.db'}"
        self.nats_url = nats_url
        self.dags_folder = Path(dags_folder).resolve()
        self.port = port or free_port()
        self.password = (password or os.environ.get("AIRFLOW_UP_PASSWORD") or self._stored_password()
                         or secrets.token_urlsafe(12))
        self.connections_in_db = connections_in_db
        self.nats_extra = dict(nats_extra or {})
        self.nats_login = nats_login
        self.extra_env = dict(extra_env or {})
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._component_of: dict[str, str] = {}  # key ("triggerer-2") -> component ("triggerer")
        self._args_of: dict[str, tuple[str, ...]] = {}  # key -> the arguments it was started with
        self._exits: dict[str, list[float]] = {}  # key -> monotonic times it exited on its own
        self._api_secrets = self._stored_api_secrets()  # shared by the components, in their environment only
        self._engine: sqlalchemy.Engine | None = None  # the tests' reads of the metadata database

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _stored(self, name: str, key: str) -> str | None:
        """``key`` of the JSON file ``home/name`` an earlier start wrote, if any."""
        try:
            stored = json.loads((self.home / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            return None
        return stored if isinstance(stored, str) and stored else None

    def _stored_password(self) -> str | None:
        """The ``admin`` password an earlier start wrote into the simple auth manager's file, if any."""
        return self._stored("passwords.json", self.user)

    def _stored_api_secrets(self) -> dict[str, str]:
        """The API's signing secrets of an earlier start, else new ones (stored by :meth:`prepare`)."""
        return {key: self._stored(API_SECRETS, key) or secrets.token_urlsafe(32)
                for key in ("jwt_secret", "secret_key")}

    def env(self) -> dict[str, str]:
        """The environment every component (and ``airflow`` CLI call) of this deployment runs with."""
        bin_dir = str(Path(sys.executable).parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__"))}
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM="4",
            AIRFLOW__CORE__TEST_CONNECTION="Enabled",
            AIRFLOW__CORE__AUTH_MANAGER=SIMPLE_AUTH_MANAGER,
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{self.user}:admin",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(self.home / "passwords.json"),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.url}/execution/",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=self.database_url,
            AIRFLOW__API__BASE_URL=self.url,
            AIRFLOW__API__HOST=self.host,
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API_AUTH__JWT_SECRET=self._api_secrets["jwt_secret"],
            AIRFLOW__API__SECRET_KEY=self._api_secrets["secret_key"],
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL="5",
            AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE="True",
            JETSTREAM_DEMO_SERVER=self.nats_url.split(",")[0].split("://", 1)[-1],
            JETSTREAM_DEMO_OUTPUT=str(self.home / "output"),
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            # the components import tests.infra (the triggerers' hostname_callable) from this checkout
            PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")])),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP=self.host,
        )
        if not self.connections_in_db:
            nats_default = nats_connection(self.nats_url, self.nats_extra, self.nats_login)
            env["AIRFLOW_CONN_NATS_DEFAULT"] = json.dumps(nats_default)
            env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(self.spark_connection)
        env.update(self.extra_env)
        return env

    def query(self, sql: str, **params: Any) -> list[tuple]:
        """The rows of ``sql`` (``:name`` parameters) in this deployment's metadata database, as Airflow wrote them."""
        if self._engine is None:
            self._engine = sqlalchemy.create_engine(self.database_url)
        with self._engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sqlalchemy.text(sql), params)]

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` against this deployment; raises with the output tail when it fails."""
        proc = subprocess.run([AIRFLOW, *args], env=self.env(), capture_output=True, text=True, timeout=timeout,
                              check=False)
        if proc.returncode != 0:
            raise LocalAirflowError(f"airflow {' '.join(args)} failed (exit {proc.returncode}):\n"
                                    f"{(proc.stdout + proc.stderr)[-3000:]}")
        return proc

    def prepare(self) -> None:
        """Create the home, (re)write the password file, create or upgrade the database and store the
        connections when asked: run on every start, so a restart refreshes the login and connections."""
        self.home.mkdir(parents=True, exist_ok=True)
        write_private(self.home / "passwords.json", {self.user: self.password})
        write_private(self.home / API_SECRETS, self._api_secrets)
        self.cli("db", "migrate")
        with contextlib.suppress(FileNotFoundError):  # written by Airflow's first command, with a new fernet_key
            (self.home / "airflow.cfg").chmod(0o600)
        if self.connections_in_db:
            conns = self.home / "connections.json"  # may hold credentials: private, and gone once imported
            write_private(conns, {
                "nats_default": nats_connection(self.nats_url, self.nats_extra, self.nats_login),
                "spark_default": self.spark_connection,
            })
            try:
                self.cli("connections", "import", "--overwrite", str(conns))
            finally:
                conns.unlink()

    def start(self, components: tuple[str, ...] = COMPONENTS, *, timeout: float = 240) -> LocalAirflow:
        """Prepare, start ``components`` and wait until the api-server is healthy."""
        self.prepare()
        for name in components:
            self.start_component(name)
        if "api-server" in components:
            self.wait_healthy(timeout)
        return self

    def start_component(self, name: str, key: str | None = None, args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """Start one component (``key`` names a second instance, e.g. ``"triggerer-2"``; ``args`` follow the
        command, e.g. ``start_component("celery", "celery-worker", ("worker",))``)."""
        key = key or name
        if key in self.processes and self.processes[key].poll() is None:
            raise LocalAirflowError(f"{key} is already running (pid {self.processes[key].pid})")
        command = [AIRFLOW, name, *args]
        if name == "log-server":  # a Celery worker's (run with --skip-serve-logs): Airflow's own binds every address
            command = [sys.executable, "-m", "uvicorn", "--factory", "airflow.utils.serve_logs.log_server:get_app",
                       "--host", self.host, "--port", str(WORKER_LOG_SERVER_PORT), "--no-access-log", *args]
        elif name == "api-server":
            command += ["--host", self.host, "--port", str(self.port), "--workers", "1"]
        elif name in ("scheduler", "triggerer"):
            command += ["--skip-serve-logs"]
        log_dir = self.home / "components"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = self.env()
        if name == "triggerer":  # its job row names it, so one can tell which triggerer runs a trigger
            env.update(LOCAL_AIRFLOW_COMPONENT=key,
                       AIRFLOW__CORE__HOSTNAME_CALLABLE="tests.infra.airflow_local.component_hostname")
        with (log_dir / f"{key}.log").open("ab") as out:
            proc = subprocess.Popen(self.launch(command), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes[key] = proc
        self._component_of[key] = name
        self._args_of[key] = args
        return proc

    def restart_exited(self) -> list[str]:
        """Start again each component that exited on its own (not through :meth:`stop`); returns their keys.

        Each restart is one line on stderr with the exit code and the last lines of the component's log.
        A component exiting ``CRASH_LOOP_RESTARTS`` times within ``CRASH_LOOP_WINDOW`` seconds raises
        :class:`LocalAirflowError` instead (it would only crash again).
        """
        restarted = []
        now = time.monotonic()
        for key, proc in list(self.processes.items()):
            if proc.poll() is None:
                continue
            exits = [t for t in self._exits.get(key, []) if now - t < CRASH_LOOP_WINDOW] + [now]
            self._exits[key] = exits
            self._reap_group(proc.pid)
            if len(exits) > CRASH_LOOP_RESTARTS:
                raise LocalAirflowError(f"{key} exited {len(exits)} times within {CRASH_LOOP_WINDOW:.0f} s (last exit "
                                        f"code {proc.returncode}); not restarting it:\n{self.log_tail(key)}")
            last_lines = "\n    ".join(self.log_tail(key, chars=800).splitlines()[-5:])
            print(f"{time.strftime('%H:%M:%S')} {key} exited with code {proc.returncode}; restarting it "
                  f"({len(exits)} exit(s) within {CRASH_LOOP_WINDOW:.0f} s). Its log ends:\n    {last_lines}",
                  file=sys.stderr, flush=True)
            del self.processes[key]
            self.start_component(self._component_of[key], key, self._args_of[key])
            restarted.append(key)
        return restarted

    def log_tail(self, key: str, chars: int = 3000) -> str:
        path = self.home / "components" / f"{key}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def wait_healthy(self, timeout: float = 240) -> None:
        """Poll the api-server's health endpoint (bounded by ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.processes.get("api-server")
            if proc is not None and proc.poll() is not None:
                raise LocalAirflowError(f"api-server exited with {proc.returncode}:\n{self.log_tail('api-server')}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=2) as resp:
                    if json.load(resp)["metadatabase"]["status"] == "healthy":
                        return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)  # polling a starting server; the deadline bounds it
        raise LocalAirflowError(f"api-server not healthy after {timeout}s:\n{self.log_tail('api-server')}")

    def stop(self, key: str, sig: signal.Signals = signal.SIGTERM, *, timeout: float = STOP_TIMEOUT) -> int:
        """Send ``sig`` once to one component and wait for it to exit; returns its exit code.

        SIGTERM goes to the component's main process, as ``kill <pid>`` or a service manager would
        send it; SIGKILL goes to its whole process group (a crash takes its children with it).
        """
        proc = self.processes[key]
        if proc.poll() is None:
            if sig == signal.SIGKILL:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.send_signal(sig)
        return self._wait_stopped(key, time.monotonic() + timeout)

    def _wait_stopped(self, key: str, deadline: float) -> int:
        """Wait until ``deadline`` for a signalled component to exit; past it, kill its process group (one line
        on stderr: a component that ignores one SIGTERM is a defect to see). Never a second SIGTERM: Airflow's
        triggerer takes that as "force exit" and SIGKILLs its trigger runner."""
        proc = self.processes.pop(key)
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            print(f"{key} did not exit after SIGTERM in time: killing it", file=sys.stderr, flush=True)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self._reap_group(proc.pid)
        return proc.returncode

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """Kill what is left of a stopped component's process group (its own session, started here)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

    def close(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every component: one SIGTERM each, then wait for it (``timeout`` seconds per wave; what is left then
        is killed with its process group). The api-server goes last: the scheduler's running tasks call its
        Execution API until they finish, and retried against a stopped one until they were killed."""
        api = [key for key in self.processes if self._component_of.get(key) == "api-server"]
        for wave in ([key for key in self.processes if key not in api], api):
            for key in wave:
                if self.processes[key].poll() is None:
                    self.processes[key].send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for key in wave:
                self._wait_stopped(key, deadline)
        if self._engine is not None:
            self._engine.dispose()

    def __enter__(self) -> LocalAirflow:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def json_column(value: Any) -> Any:
    """A JSON column's value from :meth:`LocalAirflow.query`: PostgreSQL's driver decodes it, sqlite's gives text."""
    return json.loads(value) if isinstance(value, str) else value


def metadata_database(home: Path) -> tuple[EmbeddedPostgres | None, str | None, str]:
    """``make up``'s database: PostgreSQL in ``home/postgres`` from the machine's binaries (installed from
    Debian's packages where missing), else sqlite; returns the cluster, its URL and the line saying which."""
    if os.environ.get("UP_DATABASE", "postgres") == "sqlite":
        return None, None, "metadata database: SQLite (UP_DATABASE=sqlite)"
    try:
        import psycopg2  # noqa: F401  Airflow's PostgreSQL driver

        pg = EmbeddedPostgres(home / "postgres").start()
    except (ImportError, EmbeddedPostgresError) as exc:
        return None, None, f"metadata database: SQLite, as a fallback: PostgreSQL is not available ({exc})"
    return pg, pg.sqlalchemy_url, (f"metadata database: PostgreSQL {pg.bin_dir.parent.name} on 127.0.0.1:{pg.port} "
                                   f"(cluster in {pg.root})")


def up_port(home: Path, name: str) -> tuple[int, str | None]:
    """The port of ``make up``'s ``name`` (a key of :data:`UP_PORTS`) and, when it is not the usual one, the line
    saying why.

    ``UP_PORT`` / ``UP_NATS_PORT`` choose one (refused when taken). Otherwise the port of the last run
    (``home/ports.json``; the first time 8080 / 4222) when it is free; when it is taken, a free one for this run
    only (the next run tries the old one again). The port used is kept in ``home/ports.json`` unless it was such
    a stand-in, so the UI address, its bookmarks and the server address in asset URIs stay the same.
    """
    variable, first_choice, what = UP_PORTS[name]
    saved_file = home / "ports.json"
    try:
        saved = json.loads(saved_file.read_text())
    except (OSError, ValueError):
        saved = {}
    line = None
    if os.environ.get(variable):
        if not os.environ[variable].isdigit():
            raise SystemExit(f"{variable}={os.environ[variable]!r}: a port is a number, e.g. {variable}={first_choice}")
        port = int(os.environ[variable])
        if not port_free(port):
            raise SystemExit(f"{variable}={port}: that port is taken on 127.0.0.1; choose another or unset {variable}")
    elif port_free(wanted := int(saved.get(name, first_choice))):
        port = wanted
    else:
        port = free_port()
        if name in saved:
            line = (f"port {wanted} of {what} (the last run's) is taken: using {port} for this run only; the next "
                    "run tries it again")
            if name == "nats-server":
                line += (f". Assets recorded meanwhile are jetstream://127.0.0.1:{port}/..., a second identity of "
                         "the same streams: free the port and restart to avoid it")
        else:
            line = f"port {wanted} for {what} is taken: using {port} (kept for the next runs)"
    if line is None or name not in saved:
        saved_file.write_text(json.dumps({**saved, name: port}))
    return port, line


def up_folders() -> tuple[Path, Path]:
    """``(home, dags_folder)`` of ``make up``: ``UP_HOME`` and ``UP_DAGS_FOLDER`` when set, else ``.up/`` and
    ``dags_examples/`` of the repository checkout (the current directory, or the one an editable install
    points at). Installed from a wheel there is no checkout: :class:`SystemExit` says what to set."""
    checkout = next((folder for folder in (Path.cwd(), Path(__file__).resolve().parents[2])
                     if (folder / "dags_examples").is_dir()), Path.cwd())
    home = Path(os.environ.get("UP_HOME") or checkout / ".up")
    dags = Path(os.environ.get("UP_DAGS_FOLDER") or checkout / "dags_examples")
    if not dags.is_dir():
        raise SystemExit(f"no DAGs folder at {dags}: run this from a checkout of airflow-jetstream (it uses the "
                         "checkout's dags_examples/), or set UP_DAGS_FOLDER to a folder of DAGs")
    return home, dags


def main() -> int:
    """``make up``: an embedded nats-server, PostgreSQL and a local Airflow with the example DAGs, until Ctrl-C.

    Run again on the same directory it is the same deployment: the same database, login (kept in
    ``.up/airflow/passwords.json``, mode 600, unless ``AIRFLOW_UP_PASSWORD`` sets another), UI and nats-server
    ports when they are free (:func:`up_port`), streams and so asset URIs; it refreshes the connections.
    A component that exits is restarted (one line on stderr each time). Ctrl-C or SIGTERM stops each component
    with one SIGTERM and waits for it (:meth:`LocalAirflow.close`).
    """
    from airflow_jetstream.embedded.server import EmbeddedNatsServer

    home, dags = up_folders()
    home.mkdir(parents=True, exist_ok=True)
    stop = StopRequest()
    ports = {}
    for name in UP_PORTS:
        ports[name], line = up_port(home, name)
        if line:
            print(line, flush=True)
    pg, database_url, database_line = metadata_database(home)
    print(database_line, flush=True)
    stopped: list[float] = []  # when stopping began, when Airflow had stopped
    try:
        with EmbeddedNatsServer(store_dir=home / "nats", port=ports["nats-server"]) as nats:
            print(f"nats-server (JetStream) at {nats.url}", flush=True)
            airflow = LocalAirflow(home / "airflow", nats_url=nats.url, dags_folder=dags, port=ports["api-server"],
                                   connections_in_db=True, database_url=database_url)

            def start() -> str:
                print("preparing Airflow (db migrate, login, connections) ...", flush=True)
                airflow.start()
                return (f"\nAirflow UI: {airflow.url}\n  login: {airflow.user} / {airflow.password}"
                        "   (the same on the next runs; set AIRFLOW_UP_PASSWORD to choose it)\n"
                        f"  component logs: {airflow.home / 'components'}\nCtrl-C stops everything.")

            def close() -> None:
                stopped.append(time.monotonic())
                airflow.close()
                stopped.append(time.monotonic())

            if serve(stop, "up", start=start, restart_exited=airflow.restart_exited,
                     stopping="stopping Airflow and nats-server ...", close=close, errors=(LocalAirflowError,)):
                return 1
    finally:
        if pg is not None:
            pg.stop()
    print(f"stopped in {time.monotonic() - stopped[0]:.0f} s (Airflow {stopped[1] - stopped[0]:.0f} s)",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

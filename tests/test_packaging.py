"""Release artefacts: ``python -m build`` gives a wheel and an sdist that pass ``twine check``,
carry only the package (no tests, examples or benchmarks), and the wheel installs into a new venv
where Airflow finds the provider with the right metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from airflow_jetstream import __version__
from airflow_jetstream.get_provider_info import get_provider_info

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[1]
NOT_SHIPPED = ("tests/", "dags_examples/", "bench/", "docs/", "site/", "conftest.py")
# What starts PostgreSQL, Airflow or Spark servers (apt-get, initdb, Spark's master/worker/Connect classes).
DEV_INFRA_MARKS = ("apt-get", "initdb", "pg_ctl", "deploy.master.Master", "deploy.worker.Worker",
                   "connect.service.SparkConnectServer")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)])
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("airflow_jetstream-*.whl")
    return wheel


def _sdist(dist: Path) -> Path:
    (sdist,) = dist.glob("airflow_jetstream-*.tar.gz")
    return sdist


def test_wheel_holds_the_package_and_nothing_else(dist: Path) -> None:
    names = zipfile.ZipFile(_wheel(dist)).namelist()
    dist_info = f"airflow_jetstream-{__version__}.dist-info/"
    strays = [n for n in names if not n.startswith(("airflow_jetstream/", dist_info))]
    assert not strays, f"unexpected files in the wheel: {strays}"
    assert not [n for n in names if any(part in n for part in NOT_SHIPPED)]
    # Every tracked file of the package: modules and package data (the view's templates and stylesheet).
    tracked = set(_run(["git", "ls-files", "airflow_jetstream"], cwd=REPO).stdout.split())
    missing = sorted(tracked - set(names))
    assert not missing, f"package files missing from the wheel: {missing}"
    assert {"airflow_jetstream/ui/templates/connection.html", "airflow_jetstream/ui/static/view.css"} <= set(names)
    assert f"{dist_info}licenses/LICENSE" in names
    # Development infrastructure (PostgreSQL, a local Airflow, Spark clusters for `make up`, the demos and this
    # suite) lives in tests/infra, not in what every worker installs.
    wheel = zipfile.ZipFile(_wheel(dist))
    infra = [n for n in names if n.endswith(".py")
             and any(mark in wheel.read(n).decode() for mark in DEV_INFRA_MARKS)]
    assert not infra, f"development infrastructure in the wheel: {infra}"
    assert "airflow_jetstream/py.typed" in names  # the type hints are part of the API (PEP 561)


def test_wheel_metadata(dist: Path) -> None:
    with zipfile.ZipFile(_wheel(dist)) as wheel:
        meta = Parser().parsestr(wheel.read(f"airflow_jetstream-{__version__}.dist-info/METADATA").decode())
        entry_points = wheel.read(f"airflow_jetstream-{__version__}.dist-info/entry_points.txt").decode()
    assert meta["Name"] == "airflow-jetstream"
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.11"
    requires = meta.get_all("Requires-Dist")
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if "==" in r], f"exact pins belong in constraints/, not the metadata: {runtime}"
    assert "apache-airflow>=3.2.0" in runtime, f"Airflow gets a floor, no cap on its major: {runtime}"
    assert any(r.startswith("nats-py[nkeys]") and ">=" in r and "<2.17" in r for r in runtime), runtime
    spark = ("apache-airflow-providers-apache-spark", "pyspark", "pyspark-client", "pyarrow", "pandas")
    assert not [r for r in runtime if r.split(">")[0].split("<")[0].split("=")[0].strip() in spark], \
        f"the Spark provider and pyspark belong to the spark extra: {runtime}"
    assert {r.split(">")[0].split("<")[0] for r in requires if 'extra == "spark"' in r} >= set(spark)
    assert "[apache_airflow_provider]" in entry_points
    assert "provider_info = airflow_jetstream.get_provider_info:get_provider_info" in entry_points


def test_sdist_has_sources_license_and_changelog_but_no_tests(dist: Path) -> None:
    with tarfile.open(_sdist(dist)) as sdist:
        names = [n.split("/", 1)[1] for n in sdist.getnames() if "/" in n]
    for required in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "airflow_jetstream/__init__.py"):
        assert required in names, required
    assert not [n for n in names if n.startswith(NOT_SHIPPED)]


def test_twine_check(dist: Path) -> None:
    proc = _run([sys.executable, "-m", "twine", "check", "--strict", str(_wheel(dist)), str(_sdist(dist))])
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_wheel_installs_into_a_new_venv(dist: Path, tmp_path: Path) -> None:
    """The wheel, not the source tree, is what Airflow loads there.

    The new venv sees this venv's third-party packages through a .pth file (installing Airflow's
    ~200 dependencies afresh would take minutes); the provider itself comes only from the wheel.
    """
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    new_site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    Path(new_site, "dev-venv-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(_wheel(dist))])

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON"))}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow-home")
    where = _run(
        [str(python), "-c", "import airflow_jetstream.operators.stream as m, airflow_jetstream as p; "
         "print(p.__file__); print(p.__version__)"],
        cwd=tmp_path, env=env,
    ).stdout.split()
    assert where[0].startswith(new_site), f"imported from {where[0]}, not from the installed wheel"
    assert where[1] == __version__

    shown = _run([str(python), "-m", "airflow", "providers", "get", "airflow-jetstream", "--full", "-o", "json"],
                 cwd=tmp_path, env=env)
    (info,) = json.loads(shown.stdout[shown.stdout.index("["):])
    expected = json.loads(json.dumps(get_provider_info()))
    assert (info["package-name"], info["name"]) == ("airflow-jetstream", "NATS JetStream")
    assert info["versions"] == [__version__]
    for key in ("connection-types", "asset-uris", "hooks", "operators", "sensors", "triggers", "queues"):
        assert _as_cli_prints(info[key]) == _as_cli_prints(expected[key]), key


def _as_cli_prints(value):
    """``airflow providers get -o json`` prints booleans nested in provider info as strings."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, dict):
        return {k: _as_cli_prints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_cli_prints(v) for v in value]
    return value

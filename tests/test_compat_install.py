"""The built wheel installs into a venv that already has another supported Airflow (the "lowest" venv of
the compatibility matrix, `make compat`): pip keeps that Airflow, the provider registers with its
connection type, the example DAGs parse, and the event-driven queue (Airflow 3.3+) is refused naming
the Airflow it needs.

Runs only when ``COMPAT_VENV`` names that venv (``.ci/compat`` builds it and sets it); `make test` skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_jetstream import __version__

pytestmark = [pytest.mark.compat, pytest.mark.packaging]

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("COMPAT_VENV", REPO / ".venv-compat-lowest")).absolute()
PYTHON = VENV / "bin" / "python"
DAGS = ("jetstream_orders_pipeline.py", "jetstream_orders_replay.py", "orders_pipeline_common.py",
        "event_driven_dag.py")

if "COMPAT_VENV" not in os.environ or not (VENV / ".compat-stamp").exists():
    pytest.skip("needs the lowest compatibility venv: `make compat` builds it and runs this", allow_module_level=True)


def _run(cmd: list[str | Path], **kwargs) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _installed() -> dict[str, str]:
    out = _run([PYTHON, "-m", "pip", "list", "--format", "json"])
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str]]:
    """(versions before, versions after) a plain ``pip install <wheel>`` into the lowest venv."""
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", dist, REPO])
    (wheel,) = dist.glob("airflow_jetstream-*.whl")
    if "airflow-jetstream" in _installed():  # a wheel from an earlier run
        _run([PYTHON, "-m", "pip", "uninstall", "--yes", "--quiet", "airflow-jetstream"])
    before = _installed()
    _run([PYTHON, "-m", "pip", "install", "--quiet", wheel])
    return before, _installed()


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON"))}
    env.update(AIRFLOW_HOME=str(tmp_path / "airflow-home"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path / "dags"))
    return env


def test_pip_keeps_the_installed_airflow(installed: tuple[dict[str, str], dict[str, str]]) -> None:
    before, after = installed
    assert after.pop("airflow-jetstream") == __version__
    changed = {name: (before.get(name), version) for name, version in after.items() if before.get(name) != version}
    assert not changed, f"installing the wheel changed other packages: {changed}"
    assert after["apache-airflow"] == before["apache-airflow"] != _dev_airflow()


def _dev_airflow() -> str:
    from importlib.metadata import version

    return version("apache-airflow")


def test_provider_and_connection_type_register(installed, tmp_path: Path) -> None:
    env = _env(tmp_path)
    listed = _run([VENV / "bin" / "airflow", "providers", "list", "-o", "json"], cwd=tmp_path, env=env)
    providers = {p["package_name"]: p["version"] for p in json.loads(listed[listed.index("["):])}
    assert providers.get("airflow-jetstream") == __version__
    hooks = _run([VENV / "bin" / "airflow", "providers", "hooks", "-o", "json"], cwd=tmp_path, env=env)
    types = {h["connection_type"]: h for h in json.loads(hooks[hooks.index("["):])}
    assert types["nats"]["class"] == "airflow_jetstream.hooks.jetstream.JetStreamHook"
    assert types["nats"]["package_name"] == "airflow-jetstream"


def test_example_dags_parse(installed, tmp_path: Path) -> None:
    (tmp_path / "dags").mkdir()
    for name in DAGS:
        shutil.copy(REPO / "dags_examples" / name, tmp_path / "dags" / name)
    script = (
        "import json, sys\n"
        "try:\n    from airflow.dag_processing.dagbag import DagBag\n"
        "except ImportError:\n    from airflow.models.dagbag import DagBag\n"
        "bag = DagBag(dag_folder=sys.argv[1])\n"
        "print(json.dumps({'dags': sorted(bag.dag_ids), 'errors': bag.import_errors}))\n"
    )
    env = {**_env(tmp_path), "PYTHONPATH": str(tmp_path / "dags")}  # orders_pipeline_common beside the DAGs
    out = _run([PYTHON, "-c", script, tmp_path / "dags"], cwd=tmp_path, env=env)
    parsed = json.loads(out.strip().splitlines()[-1])
    assert parsed["errors"] == {}, parsed["errors"]
    assert {"jetstream_orders_pipeline", "jetstream_orders_replay", "process_ready_orders"} <= set(parsed["dags"])


def test_event_driven_queue_names_the_airflow_it_needs(installed, tmp_path: Path) -> None:
    """Shared-stream triggers need Airflow 3.3: on an older one the queue provider is a typed refusal."""
    _before, after = installed
    proc = subprocess.run([str(PYTHON), "-c", "import airflow_jetstream.queues.jetstream"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=_env(tmp_path))
    if tuple(int(p) for p in after["apache-airflow"].split(".")[:2]) >= (3, 3):
        assert proc.returncode == 0, proc.stderr[-2000:]
    else:
        assert proc.returncode != 0
        assert "AirflowVersionError" in proc.stderr and "need Airflow 3.3.0 or newer" in proc.stderr, proc.stderr

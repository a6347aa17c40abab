"""The Spark provider and pyspark come only with the ``spark`` extra: a NATS-only install imports the provider,
its hooks, operators, sensors and triggers, parses the example DAGs that do not use Spark, and Airflow loads the
provider without a warning; the Spark operator fails at DAG parse with Airflow's optional-feature error naming
the extra.

The venv here is a real one (``python -m venv``) whose site-packages are this venv's minus the Spark provider,
pyspark, pyspark-client and py4j (a link per entry: no install needed). The install leg of `make compat`
(tests/test_install_commands.py) runs the same probe in a venv pip filled from the index without the extra.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: What the spark extra adds to a NATS-only install (top-level names in site-packages).
SPARK_ENTRIES = ("pyspark", "pyspark-", "pyspark_client-", "py4j", "apache_airflow_providers_apache_spark-")
SPARK_PROVIDER = ("airflow", "providers", "apache", "spark")
EXTRA_HINT = 'pip install "airflow-jetstream[spark]"'


def _link_tree(source: Path, target: Path, skip: tuple[str, ...]) -> None:
    """``target`` mirrors ``source`` with one symlink per entry, leaving out ``skip`` (a path of names below it)."""
    target.mkdir()
    for entry in source.iterdir():
        if skip and entry.name == skip[0]:
            if len(skip) > 1:
                _link_tree(entry, target / entry.name, skip[1:])
            continue
        (target / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def nats_only_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nats-only")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    packages = Path(sysconfig.get_path("purelib"))
    for entry in packages.iterdir():
        if entry.name.startswith(SPARK_ENTRIES):
            continue
        if entry.name == SPARK_PROVIDER[0]:
            _link_tree(entry, site / entry.name, SPARK_PROVIDER[1:])
        else:
            (site / entry.name).symlink_to(entry)
    return python


def _probe(python: Path, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV"))}
    env.update(AIRFLOW_HOME=str(tmp_path / "airflow-home"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__UNIT_TEST_MODE="True", PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'dags_examples'}")
    proc = subprocess.run([str(python), "-m", "tests.support.nats_only_probe", str(REPO / "dags_examples")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _needs(dag_file: str) -> str | None:
    """The extra an example DAG file needs beyond a NATS-only install, read from its source."""
    source = (REPO / "dags_examples" / dag_file).read_text(encoding="utf-8")
    if "spark_submit" in source or "task.pyspark" in source:
        return "spark"
    return "messaging" if "providers.common.messaging" in source else None


def assert_nats_only_install_works(found: dict, *, messaging: bool = True) -> None:
    """What a NATS-only install must give (also asserted on the index installs, tests/test_install_commands.py);
    ``messaging``: the install has the messaging extra (the event-driven example DAG needs it)."""
    errors = dict(found["import_errors"])
    if not messaging:  # the queue needs common-messaging: Airflow's optional-feature error naming that extra
        queue = errors.pop("airflow_jetstream.queues.jetstream", "")
        assert queue.startswith("AirflowOptionalProviderFeatureException") and "[messaging]" in queue, queue
    assert found["imported"] > 50 and errors == {}, errors
    assert found["loaded"] == [], f"a NATS-only import loaded {found['loaded']}"
    refused = found["spark_operator"]
    assert refused and refused["type"] == "AirflowOptionalProviderFeatureException", refused
    assert EXTRA_HINT in refused["message"]
    for name, parsed in found["dag_files"].items():
        needs = _needs(name)
        if needs is None or (needs == "messaging" and messaging):
            assert parsed["dags"] and parsed["errors"] == {}, (name, parsed)
            continue
        assert not parsed["dags"] and len(parsed["errors"]) == 1, (name, parsed)
        (error,) = parsed["errors"].values()
        if "spark_submit" in (REPO / "dags_examples" / name).read_text(encoding="utf-8"):
            assert "AirflowOptionalProviderFeatureException" in error and EXTRA_HINT in error, error
        else:
            assert needs in error, error  # @task.pyspark: no Spark provider; common.messaging: not installed
    manager = found["providers_manager"]
    assert manager["version"] and manager["nats_hook"] == "airflow_jetstream.hooks.jetstream.JetStreamHook"
    assert manager["extra_links"] == manager["listed_links"] and manager["extra_links"], manager
    assert "jetstream" in manager["plugins"] and manager["warnings"] == [], manager


def test_a_nats_only_install_imports_parses_and_registers(nats_only_python: Path, tmp_path: Path) -> None:
    found = _probe(nats_only_python, tmp_path)
    assert Path(found["package"]).is_relative_to(REPO), "the checkout's package, through the editable install"
    assert_nats_only_install_works(found)
    non_spark = {n for n, p in found["dag_files"].items() if p["dags"]}
    assert {"event_driven_dag.py", "kafka_style_dag.py"} <= non_spark


def test_the_venv_really_lacks_the_spark_provider_and_pyspark(nats_only_python: Path) -> None:
    missing = subprocess.run(
        [str(nats_only_python), "-c", "import importlib.util as u, importlib.metadata as m; "
         "print([n for n in ('pyspark', 'py4j', 'airflow.providers.apache.spark') if u.find_spec(n)], "
         "[d for d in ('pyspark', 'pyspark-client', 'apache-airflow-providers-apache-spark') "
         "if any(x.metadata['Name'] == d for x in m.distributions())])"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert missing.stdout.strip().splitlines()[-1] == "[] []", missing.stdout + missing.stderr

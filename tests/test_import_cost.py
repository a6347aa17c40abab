"""What importing the provider costs: Airflow reads the provider info in every process, DAG files (and the
dag-processor and triggerer parsing them) import the operators, sensors, triggers, assets and hook. The provider
info imports nothing heavy; no DAG-file import pulls in nats-py or pyspark (they load when a task or trigger runs)."""

from __future__ import annotations

import ast
import json
import pkgutil
import pprint
import subprocess
import sys
from pathlib import Path
from typing import Any

import airflow_jetstream
from airflow_jetstream.client.settings import CONNECTION_FIELDS
from airflow_jetstream.get_provider_info import CONN_FIELDS, get_provider_info

PACKAGE = Path(airflow_jetstream.__file__).parent
#: What a DAG file, the dag-processor or the triggerer imports when it parses DAGs.
DAG_FILE_PACKAGES = ("operators", "sensors", "triggers", "assets", "hooks")


def _classes(path: Path) -> list[ast.ClassDef]:
    return [node for node in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(node, ast.ClassDef)]


def _modules_with_public_classes(package: str) -> list[str]:
    """Modules defining a public operator/sensor/trigger that nothing else builds on, read from the source."""
    paths = list((PACKAGE / package).glob("*.py"))
    bases = {base.id for path in paths for cls in _classes(path) for base in cls.bases if isinstance(base, ast.Name)}
    return sorted(f"airflow_jetstream.{package}.{path.stem}" for path in paths if any(
        not cls.name.startswith("_") and cls.name not in bases and cls.name.endswith(("Operator", "Sensor", "Trigger"))
        for cls in _classes(path)))


_FORM_TYPES = {str: "string", bool: "boolean", float: "number"}


def form_fields() -> dict[str, dict[str, Any]]:
    """The extra fields of Airflow's connection form (label, description, JSON schema), built back from
    ``CONNECTION_FIELDS``' types and secrecy: equal to ``CONN_FIELDS``, so the form's types are the settings'."""
    return {name: {"label": CONN_FIELDS[name]["label"], "description": CONN_FIELDS[name]["description"], "schema": {
        "type": [_FORM_TYPES[spec.kind], "null"],
        **({"format": "password"} if spec.secret else {}),
        **({"default": True} if spec.kind is bool else {})}} for name, spec in CONNECTION_FIELDS.items()}


def test_connection_form_in_the_provider_info_is_the_field_table():
    assert form_fields() == CONN_FIELDS, (
        "client/settings.py CONNECTION_FIELDS changed: set CONN_FIELDS in get_provider_info.py to\n"
        + pprint.pformat(form_fields(), sort_dicts=False, width=116))
    assert get_provider_info()["connection-types"][0]["conn-fields"] == CONN_FIELDS
    get_provider_info()["connection-types"][0]["conn-fields"]["token"]["schema"]["type"].append("x")
    assert CONN_FIELDS["token"]["schema"]["type"] == ["string", "null"]  # every call gives a new dict


def test_provider_info_lists_every_public_operator_sensor_and_trigger_module():
    info = get_provider_info()
    for key in ("operators", "sensors", "triggers"):
        (entry,) = info[key]
        assert sorted(entry["python-modules"]) == _modules_with_public_classes(key), key
    assert "airflow_jetstream.operators.spark_submit" in info["operators"][0]["python-modules"]


_PROBE = """
import importlib, json, os, runpy, sys
heavy = ("nats", "pyspark", "airflow", "airflow_jetstream.client")
importlib.import_module("airflow_jetstream.get_provider_info").get_provider_info()
seen = {"provider_info": sorted(m for m in heavy if m in sys.modules)}
for target in sys.argv[1:]:
    if target.endswith(".py"):  # a DAG file, parsed as the dag-processor does: its operators are built too
        sys.path.insert(0, os.path.dirname(target))
        runpy.run_path(target, run_name="parsed_dag_file")
    else:
        importlib.import_module(target)
    seen[target] = sorted(m for m in ("nats", "pyspark") if m in sys.modules)
print(json.dumps(seen))
"""


def _dag_file_modules() -> list[str]:
    modules = ["airflow_jetstream.message_events"]
    for package in DAG_FILE_PACKAGES:
        modules += sorted(info.name for info in pkgutil.iter_modules([str(PACKAGE / package)],
                                                                     f"airflow_jetstream.{package}."))
    return modules


def _example_dag_files() -> list[str]:
    return sorted(str(path) for path in (Path(__file__).resolve().parents[1] / "dags_examples").glob("*.py")
                  if "DAG(" in path.read_text(encoding="utf-8"))


def test_provider_info_and_dag_file_imports_stay_cheap():
    """In a fresh interpreter: the provider info imports no nats-py, Airflow, client or pyspark; importing every
    operator, sensor, trigger, asset and hook module, then parsing the example DAGs (which builds their operators,
    sensors and asset watchers), imports neither nats-py nor pyspark (the first module or file that does is
    named): the client modules that use them are imported when a task or trigger runs."""
    modules = _dag_file_modules() + _example_dag_files()
    assert {"airflow_jetstream.operators.spark_submit", "airflow_jetstream.triggers.message",
            "airflow_jetstream.hooks.jetstream"} <= set(modules)
    assert set(_modules_with_public_classes("operators")) <= set(modules)
    assert len(_example_dag_files()) >= 5
    proc = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen.pop("provider_info") == []
    assert next(((module, heavy) for module, heavy in seen.items() if heavy), None) is None
    assert len(seen) == len(modules)

"""Run inside a venv WITHOUT the Spark provider and pyspark (a NATS-only install): prints one JSON line.

``python -m tests.support.nats_only_probe <dags folder>`` imports every module of the provider except the
Spark data source, imports the Spark operator expecting Airflow's optional-feature error, parses each example
DAG file on its own (as the dag-processor does) and reads the provider through Airflow's ProvidersManager
(what ``airflow providers ...`` and the api-server read). tests/test_spark_optional.py and the install leg
(tests/test_install_commands.py) assert on what it prints.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import pkgutil
import sys
from pathlib import Path

#: Modules that need pyspark by design (the data source runs inside Spark) or the Spark provider.
SPARK_MODULES = ("airflow_jetstream.spark", "airflow_jetstream.operators.spark_submit")


def _provider_modules() -> list[str]:
    import airflow_jetstream

    names = [info.name for info in pkgutil.walk_packages(airflow_jetstream.__path__, "airflow_jetstream.")]
    return sorted(n for n in names if not n.startswith(SPARK_MODULES) and n != "airflow_jetstream.testing")


def _import_errors(names: list[str]) -> dict[str, str]:
    errors = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported by name, the test asserts there is none
            errors[name] = f"{type(exc).__name__}: {exc}"
    return errors


def _spark_operator_error() -> dict[str, str] | None:
    try:
        importlib.import_module("airflow_jetstream.operators.spark_submit")
    except Exception as exc:  # what a DAG file importing the operator gets
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def _parse(dag_file: Path) -> dict[str, object]:
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.2
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file), safe_mode=False)
    return {"dags": sorted(bag.dag_ids), "errors": {Path(k).name: v for k, v in bag.import_errors.items()}}


def _providers_manager() -> dict[str, object]:
    """The provider as Airflow's ProvidersManager loads it, with the warnings it logs while doing so."""
    from airflow.providers_manager import ProvidersManager

    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    logging.getLogger("airflow.providers_manager").addHandler(handler)
    manager = ProvidersManager()
    providers = {name: info.version for name, info in manager.providers.items()}
    hooks = manager.hooks
    links = sorted(manager.extra_links_class_names)
    plugins = [p.name for p in manager.plugins]
    nats = hooks.get("nats")
    from airflow_jetstream.get_provider_info import get_provider_info

    return {"version": providers.get("airflow-jetstream"),
            "listed_links": sorted(get_provider_info().get("extra-links", [])),
            "nats_hook": nats.hook_class_name if nats else None,
            "extra_links": [link for link in links if link.startswith("airflow_jetstream.")],
            "plugins": plugins,
            "warnings": [line for line in captured.getvalue().splitlines() if "airflow_jetstream" in line]}


def main(dags: Path) -> dict[str, object]:
    import airflow_jetstream

    modules = _provider_modules()
    result: dict[str, object] = {
        "package": airflow_jetstream.__file__,
        "imported": len(modules),
        "import_errors": _import_errors(modules),
        "spark_operator": _spark_operator_error(),
        "dag_files": {path.name: _parse(path) for path in sorted(dags.glob("*.py"))
                      if "DAG(" in path.read_text(encoding="utf-8") or "@dag" in path.read_text(encoding="utf-8")},
        "providers_manager": _providers_manager(),
    }
    result["loaded"] = sorted(m for m in ("pyspark", "airflow.providers.apache.spark", "grpc") if m in sys.modules)
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))

"""The public API users can pin: docs/api.md renders exactly the Airflow classes of the provider info and the
public packages' ``__all__``, the docs and example DAGs import nothing else, every client error class is exported,
``py.typed``, and input checks every entry point shares (a string where subjects go)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_jetstream
import airflow_jetstream.client as client
from airflow_jetstream.client.admin.consumers import normalize_consumer_config
from airflow_jetstream.client.admin.streams import normalize_stream_config
from airflow_jetstream.client.admin.worker_consumers import normalize_subjects
from airflow_jetstream.client.advisories.capture import capture_stream_config
from airflow_jetstream.client.errors import ConsumerConfigError, InvalidSubjectError, JetStreamError, StreamConfigError
from airflow_jetstream.client.reading.consume import consume
from airflow_jetstream.client.reading.read_plan import plan_read
from airflow_jetstream.client.subjects import validate_subjects

REPO = Path(__file__).resolve().parents[1]


#: Packages whose ``__all__`` is public: docs/api.md renders each whole.
PUBLIC_PACKAGES = ("airflow_jetstream.client", "airflow_jetstream.client.advisories", "airflow_jetstream.client.kv",
                   "airflow_jetstream.client.ledger", "airflow_jetstream.client.sourcing", "airflow_jetstream.assets",
                   "airflow_jetstream.spark", "airflow_jetstream.embedded", "airflow_jetstream.message_events",
                   "airflow_jetstream.testing")
_PUBLIC_SUFFIXES = ("Hook", "Operator", "Sensor", "Trigger", "Provider")
_IMPORT = re.compile(r"^\s*from (airflow_jetstream(?:\.\w+)*) import (\([^)]*\)|[^\n]+)", re.M)


def _api_entries() -> dict[str, frozenset[str] | None]:
    """docs/api.md's ``::: module`` entries: the members it lists, or None for the whole module (its ``__all__``)."""
    text = (REPO / "docs" / "api.md").read_text()
    entries: dict[str, frozenset[str] | None] = {}
    for match in re.finditer(r"^::: (\S+)\n(?:    options:\n      members: \[([^\]]*)\]\n)?", text, flags=re.M):
        module, members = match.group(1), match.group(2)
        assert module not in entries, f"{module} is listed twice"
        entries[module] = frozenset(m.strip() for m in members.split(",")) if members is not None else None
    return entries


def _airflow_classes() -> dict[str, set[str]]:
    """The hook, operators, sensors, triggers and queue provider the provider info registers, by module."""
    from airflow_jetstream.get_provider_info import get_provider_info

    info = get_provider_info()
    modules = [m for key in ("hooks", "operators", "sensors", "triggers") for m in info[key][0]["python-modules"]]
    modules += [path.rsplit(".", 1)[0] for path in info["queues"]]
    found: dict[str, set[str]] = {}
    for name in modules:
        for cls_name, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
            if cls.__module__ == name and cls_name.endswith(_PUBLIC_SUFFIXES) and not cls_name.startswith("_") \
                    and "Base" not in cls_name:
                found.setdefault(name, set()).add(cls_name)
    return found


def _doc_imports() -> list[tuple[str, str, list[str]]]:
    """(file, module, names) of every ``from airflow_jetstream... import`` in the docs, README and example DAGs."""
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "dags_examples").glob("*.py"))]
    found = []
    for path in files:
        for match in _IMPORT.finditer(path.read_text()):
            names = [n.strip() for n in match.group(2).strip("()").replace("\n", " ").split(",") if n.strip()]
            found.append((str(path.relative_to(REPO)), match.group(1), names))
    return found


def _is_module(package: str, name: str) -> bool:
    is_package = hasattr(importlib.import_module(package), "__path__")
    return is_package and importlib.util.find_spec(f"{package}.{name}") is not None


def _client_error_classes() -> set[type[JetStreamError]]:
    classes = set()
    for module in pkgutil.walk_packages(client.__path__, "airflow_jetstream.client."):
        for _, obj in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(obj, JetStreamError) and obj.__module__.startswith("airflow_jetstream.client"):
                classes.add(obj)
    return classes


def test_docs_api_renders_exactly_the_public_api() -> None:
    """Public: the Airflow classes of the provider info, the public packages' ``__all__``, and the modules the docs
    import as modules. docs/api.md lists exactly these (no internal module, nothing missing)."""
    expected: dict[str, frozenset[str] | None] = {package: None for package in PUBLIC_PACKAGES}
    expected.update({module: frozenset(names) for module, names in _airflow_classes().items()})
    for _, module, names in _doc_imports():
        expected.update({f"{module}.{n}": None for n in names if module in PUBLIC_PACKAGES and _is_module(module, n)})
    assert _api_entries() == expected


@pytest.mark.parametrize(("where", "module", "names"), _doc_imports(), ids=lambda value: str(value))
def test_the_docs_and_examples_import_only_the_public_api(where: str, module: str, names: list[str]) -> None:
    entries = _api_entries()
    for name in names:
        if module in entries and entries[module] is None and module in PUBLIC_PACKAGES:
            assert name in importlib.import_module(module).__all__ or _is_module(module, name), (where, module, name)
        else:
            assert name in (entries.get(module) or ()), f"{where}: {module}.{name} is not in the public API"


def test_every_public_package_exports_what_it_says() -> None:
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        assert module.__all__ and len(module.__all__) == len(set(module.__all__)), package
        for name in module.__all__:
            assert not name.startswith("_") and getattr(module, name) is not None, (package, name)


def test_every_error_is_a_jetstream_error_with_a_reason_and_all_has_no_internals() -> None:
    """Users catch :class:`JetStreamError` and branch on its ``reason`` (docs/api.md); the subclasses' names are
    internal, so a new one is not an API change."""
    errors = _client_error_classes()
    assert {"LeaderUnavailableError", "FastBatchError", "KeyNotFoundError", "SourceUnhealthyError"} <= {
        cls.__name__ for cls in errors}
    assert not [cls for cls in errors if not (issubclass(cls, JetStreamError) and cls.default_reason)]
    assert "JetStreamError" in client.__all__
    for name in client.__all__:
        assert not name.startswith("_") and getattr(client, name) is not None
    assert "stored_sequences" not in client.__all__


#: Exported names before the API was cut to what the docs and examples import (0.1.0 development).
NAMES_BEFORE_THE_CUT = 155


def test_the_exported_names_are_what_the_docs_and_examples_import() -> None:
    """Each public package's ``__all__`` is what the docs and example DAGs import from it (the test fixtures are
    used by name, not imported), and all of them with the Airflow classes are at most half of what was exported."""
    imported: dict[str, set[str]] = {}
    for _, module, names in _doc_imports():
        imported.setdefault(module, set()).update(n for n in names if not _is_module(module, n))
    for package in PUBLIC_PACKAGES:
        if package != "airflow_jetstream.testing":
            assert set(importlib.import_module(package).__all__) == imported[package], package
    exported = sum(len(importlib.import_module(p).__all__) for p in PUBLIC_PACKAGES)
    exported += sum(len(names) for names in _airflow_classes().values())
    assert exported <= NAMES_BEFORE_THE_CUT // 2, exported


_LAZY_PROBE = """
import json, sys
from airflow_jetstream.client.settings import ConnectionSettings
before = sorted(m for m in ("nats", "airflow_jetstream.client.batches.batcher") if m in sys.modules)
from airflow_jetstream.client import Batcher, open_connection
import airflow_jetstream.client as client
hidden = sorted(set(client.__all__) - set(dir(client)))
print(json.dumps({"before": before, "after": "nats" in sys.modules, "dir": hidden}))
"""


def test_the_client_package_imports_a_name_only_when_it_is_used() -> None:
    """A Spark worker unpickling the data source, or a DAG file needing ``ConnectionSettings``, does not pay
    for every client module; ``from airflow_jetstream.client import X`` still works for every name."""
    probe = subprocess.run([sys.executable, "-c", _LAZY_PROBE], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(probe.stdout) == {"before": [], "after": True, "dir": []}
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = client.not_a_name


@pytest.mark.parametrize("package", ["advisories", "kv", "ledger", "sourcing"])
def test_client_subpackages_resolve_every_exported_name_on_first_use(package: str) -> None:
    """``from airflow_jetstream.client.kv import put_key`` works for every name of ``__all__``, though importing
    the subpackage imports none of its modules (so its nats-free modules stay cheap to import)."""
    module = importlib.import_module(f"airflow_jetstream.client.{package}")
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        value = getattr(module, name)
        assert value is not None and getattr(module, name) is value
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = module.not_a_name


def test_the_package_is_marked_typed() -> None:
    assert (Path(airflow_jetstream.__file__).parent / "py.typed").is_file()
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*airflow_jetstream = \["py\.typed"[,\]]', pyproject)


@pytest.mark.parametrize("check", [
    lambda s: validate_subjects(s),
    lambda s: normalize_stream_config({"name": "ORDERS", "subjects": s}),
    lambda s: normalize_consumer_config({"durable_name": "c", "filter_subjects": s}),
    lambda s: normalize_subjects(s),
    lambda s: capture_stream_config(subjects=s),
], ids=["validate_subjects", "stream", "consumer", "worker_consumer", "capture_stream"])
def test_a_string_where_subjects_go_says_it_must_be_a_list(check) -> None:
    with pytest.raises((InvalidSubjectError, StreamConfigError, ConsumerConfigError)) as info:
        check("orders.>")
    assert "must be a list" in str(info.value) and "['orders.>']" in str(info.value)
    assert "empty token" not in str(info.value)


@pytest.mark.parametrize("call", [
    lambda s: plan_read(None, "ORDERS", subjects=s),  # type: ignore[arg-type]
    lambda s: consume(None, "ORDERS", print, subjects=s),  # type: ignore[arg-type]
], ids=["plan_read", "consume"])
def test_readers_refuse_a_string_of_subjects_before_using_the_connection(call) -> None:
    with pytest.raises(InvalidSubjectError, match="must be a list"):
        asyncio.run(call("orders.>"))


def test_lists_of_subjects_still_pass() -> None:
    assert validate_subjects(("orders.>", "audit.*")) == ["orders.>", "audit.*"]
    assert normalize_stream_config({"name": "ORDERS", "subjects": ["orders.>"]})["subjects"] == ["orders.>"]

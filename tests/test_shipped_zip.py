"""The zip shipped to Spark's Python workers: self-contained by construction, and what it needs beside it.

The zip holds ``client/``, ``spark/`` and every other module of the package they import, computed from
their import statements when it is built. These tests check the built zip from outside: every import
statement of every shipped module, and every shipped module imported by a Python that refuses the
project's packages unless they come from the zip (the workers' Python of the Spark tests).
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

import airflow_jetstream
from airflow_jetstream.spark.package import build_py_files, imported_names, module_name, package_files
from tests.support.bare_python import make_bare_python

PACKAGE_DIR = Path(airflow_jetstream.__file__).parent


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_py_files(tmp_path_factory.mktemp("zip") / "airflow_jetstream_spark.zip")


def zipped_modules(zip_path: Path) -> dict[str, tuple[str, bytes]]:
    """The zip's ``airflow_jetstream`` modules: name -> (file name in the zip, source)."""
    with zipfile.ZipFile(zip_path) as archive:
        return {module_name(PACKAGE_DIR, PACKAGE_DIR.parent / name): (name, archive.read(name))
                for name in archive.namelist() if name.startswith(f"{PACKAGE_DIR.name}/")}


def run_bare(python: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True, timeout=120)


def test_the_zip_is_reproducible_and_holds_nothing_that_imports_airflow(shipped, tmp_path) -> None:
    assert build_py_files(tmp_path / "again.zip").read_bytes() == shipped.read_bytes()
    names = zipfile.ZipFile(shipped).namelist()
    assert "nats/__init__.py" in names and "airflow_jetstream/spark/writer.py" in names
    assert "airflow_jetstream/client/kv/bucket.py" in names  # client/ whole: executors' own code may use it
    assert not [n for n in names if n.startswith(("airflow_jetstream/operators", "airflow_jetstream/hooks"))]


def test_every_package_module_a_shipped_module_imports_is_shipped(shipped) -> None:
    """Every import statement that can run (module level or in a function; not ``if TYPE_CHECKING``)."""
    modules = zipped_modules(shipped)
    existing = {module_name(PACKAGE_DIR, f) for f in PACKAGE_DIR.rglob("*.py")}
    missing, airflow = [], []
    for module, (name, source) in sorted(modules.items()):
        for imported in imported_names(source, module, is_package=name.endswith("/__init__.py")):
            if imported in existing and imported not in modules:
                missing.append(f"{module} imports {imported}")
            if imported.partition(".")[0] == "airflow":
                airflow.append(f"{module} imports {imported}")
    assert missing == [], "modules the zip lacks"
    assert airflow == [], "executors have no Airflow"


#: Imports every airflow_jetstream module of the zip given as argv[1], then every name its packages export
#: lazily (PEP 562 ``__getattr__``); prints what failed.
IMPORT_ALL = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
failed = {}
for name in json.loads(sys.argv[2]):
    try:
        module = importlib.import_module(name)
        assert module.__file__.startswith(sys.argv[1]), module.__file__
        for attr in getattr(module, "__all__", []) if hasattr(module, "__getattr__") else []:
            getattr(module, attr)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def test_every_shipped_module_imports_from_the_zip_alone(shipped, tmp_path) -> None:
    """As on a Spark worker that lacks the package: imported from the zip, or refused."""
    names = sorted(zipped_modules(shipped))
    run = run_bare(make_bare_python(tmp_path / "bare"), IMPORT_ALL, str(shipped), json.dumps(names))
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == {}


def test_the_workers_python_refuses_a_submodule_the_zip_lacks(shipped, tmp_path) -> None:
    """The venv's editable install of the project finds ``airflow_jetstream.<module>`` in the source tree
    whatever the package's ``__path__`` says (how the missing ``vocabulary`` went unnoticed): refused."""
    names = zipfile.ZipFile(shipped).namelist()
    left_out = next(n for n in names if n.count("/") == 1 and n.startswith("airflow_jetstream/") and
                    not n.endswith("/__init__.py"))
    short = tmp_path / "short.zip"
    with zipfile.ZipFile(shipped) as full, zipfile.ZipFile(short, "w") as out:
        for name in names:
            if name != left_out:
                out.writestr(name, full.read(name))
    python = make_bare_python(tmp_path / "bare")
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import {}"
    module = left_out.removesuffix(".py").replace("/", ".")
    run = run_bare(python, probe.format(module), str(short))
    assert f"{module} is not in the shipped zip" in run.stderr, run.stderr[-3000:]
    assert "is not installed for this Python" in run_bare(python, probe.format("airflow"), str(short)).stderr
    assert run_bare(python, probe.format("nats.js.api"), str(short)).returncode == 0


def test_the_closure_follows_imports_at_any_depth_and_not_type_checking_ones(tmp_path) -> None:
    """A module a shipped module starts importing is shipped with nothing to update."""
    files = {
        "pkg/__init__.py": "from pkg.version import VERSION\n",
        "pkg/version.py": "VERSION = '1'\n",
        "pkg/client/__init__.py": "",
        "pkg/client/conn.py": "from pkg.tools.names import check\n",
        "pkg/spark/__init__.py": "from ..client import conn\n",
        "pkg/tools/__init__.py": "",
        "pkg/tools/names.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.hooks\n"
                               "def check():\n    from pkg import words\n"),
        "pkg/tools/unused.py": "",
        "pkg/words.py": "import airflow\n",  # not executed on import: the test of the zip above flags it
        "pkg/hooks.py": "import airflow\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    shipped = {f.relative_to(tmp_path).as_posix() for f in package_files(tmp_path / "pkg")}
    assert shipped == set(files) - {"pkg/tools/unused.py", "pkg/hooks.py"}


def test_nkey_auth_on_a_python_without_nkeys_names_what_to_install(shipped, nkey_server, nkey_user,
                                                                   tmp_path) -> None:
    """nats-py imports ``nkeys`` (and PyNaCl, compiled, so not from a zip) only for nkey and creds auth."""
    probe = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.errors import ConnectionFailedError
async def main():
    try:
        async with open_connection(ConnectionSettings(servers=sys.argv[2], nkey_seed_secret=sys.argv[3])):
            print("connected")
    except ConnectionFailedError as exc:
        print(exc.reason, exc.message)
asyncio.run(main())
"""
    python = make_bare_python(tmp_path / "bare", absent=("nkeys", "nacl"))
    run = run_bare(python, probe, str(shipped), nkey_server.url, nkey_user[0])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("nkeys_not_installed ") and "pip install nkeys" in run.stdout
    assert nkey_user[0] not in run.stdout + run.stderr

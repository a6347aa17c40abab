"""Every install command the README and docs/ print is run here, the way a user runs it.

The commands are read from the Markdown (code blocks and inline code), so a new one fails
``test_every_printed_install_command_is_run_here`` until this module runs it. How each runs:

- ``venv``: into a fresh venv, as printed, from a copy of the checkout with the wheel built into ``dist/``
  (``make wheel``); a command naming ``airflow-jetstream`` from the index gets that wheel as the index's copy
  (``--find-links``: the package is not published yet). Then ``pip check``, Airflow loads the provider, the
  package is the installed one, pyspark's files are one release with its jars, a NATS-only install runs
  tests/support/nats_only_probe.py, and the ``server`` extra runs docs/testing.md's user tests. ``keep`` venvs
  stay under ``$INSTALL_VENVS`` with pytest added: `make compat` runs the compat subset and a Spark write/read
  in them (.ci/compat).
- ``resolve``: the constraints-file installs, as printed with ``--dry-run``: they resolve to the pinned versions
  (what `make install` installs for real on every CI run, with every extra).
- ``make install``: the printed command is what `make install` runs.

pip runs as on a user's machine: no pip configuration file and no ``PIP_*`` variables (this box has a global
constraint file, extra local indexes and find-links; ``PIP_CONFIG_FILE=/dev/null`` turns all files off), the
public index, and pip's cache (a user has one too). Installs without pins get the newest releases the ranges
allow. The install tests run only where ``INSTALL_VENVS`` names a folder (the install leg of .ci/compat).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_jetstream import __version__
from tests.support.checkout import copy_checkout

REPO = Path(__file__).resolve().parents[1]
PYVER = "{}.{}".format(*sys.version_info[:2])
CONSTRAINTS = f"constraints/constraints-{PYVER}.txt"
WHEEL = f"dist/airflow_jetstream-{__version__}-py3-none-any.whl"
INSTALL_VENVS = os.environ.get("INSTALL_VENVS")
#: pip runs at a time (they mostly wait for the index and the disk; measured in docs/compatibility.md).
PARALLEL = 4


@dataclass(frozen=True)
class Run:
    how: str  # "venv", "resolve" or "make install"
    keep: str = ""  # the venv's name under $INSTALL_VENVS, kept for the compat subset
    spark: bool = False  # the spark extra: pyspark's files one release with its jars
    nats_only: bool = False  # no Spark provider, no pyspark: tests/support/nats_only_probe.py
    user_tests: bool = False  # docs/testing.md: a user's tests with airflow_jetstream.testing's real server


def _cmd(*args: str) -> tuple[str, ...]:
    return ("pip", "install", *args)


#: Every install command the docs print, and how it runs.
RUNS: dict[tuple[str, ...], Run] = {
    _cmd(f"{WHEEL}[spark]"): Run("venv", keep="wheel", spark=True),
    _cmd(".[spark]"): Run("venv", keep="checkout", spark=True),
    _cmd("airflow-jetstream[server]", "pytest"): Run("venv", nats_only=True, user_tests=True),
    _cmd("airflow-jetstream[messaging]"): Run("venv", nats_only=True),
    _cmd("-c", CONSTRAINTS, ".[spark,messaging]"): Run("resolve"),
    _cmd("-c", CONSTRAINTS, ".[messaging]"): Run("resolve"),
    _cmd("-c", CONSTRAINTS, ".[server]"): Run("resolve"),
    _cmd("-c", CONSTRAINTS, ".[server,spark]"): Run("resolve"),
    _cmd("-c", CONSTRAINTS, "-e", ".[spark,messaging,server]", "--group", "dev"): Run("make install"),
}

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`\n]*pip install[^`\n]*)`")


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def printed_commands(text: str) -> list[tuple[str, ...]]:
    """The ``pip install`` commands in Markdown ``text`` (code blocks and inline code), as argument lists."""
    found = []
    blocks = _FENCE.findall(text)
    lines = [line for block in blocks for line in block.splitlines()]
    lines += _INLINE.findall(_FENCE.sub("", text))
    for line in lines:
        start = line.find("pip install")
        if start < 0:
            continue
        args = shlex.split(line[start:], comments=True)
        cut = next((i for i, arg in enumerate(args) if arg in ("&&", ";", "|")), len(args))
        if len(args[:cut]) > 2:  # "pip install" alone is prose ("`pip install` of the wheel")
            found.append(tuple(args[:cut]))
    return found


def documented() -> dict[tuple[str, ...], list[str]]:
    where: dict[tuple[str, ...], list[str]] = {}
    for page in doc_pages():
        for command in printed_commands(page.read_text(encoding="utf-8")):
            where.setdefault(command, []).append(page.relative_to(REPO).as_posix())
    return where


def test_every_printed_install_command_is_run_here() -> None:
    printed = documented()
    unrun = {" ".join(c): pages for c, pages in printed.items() if c not in RUNS}
    assert not unrun, f"install commands the docs print that no test runs (add them to RUNS): {unrun}"
    stale = [" ".join(c) for c in RUNS if c not in printed]
    assert not stale, f"RUNS lists commands no page prints any more: {stale}"


def test_the_extraction_reads_blocks_and_inline_code() -> None:
    text = ('Install `pip install "a[b]"` or:\n\n```bash\npip install -c c.txt ".[x]"   # pinned\n'
            "python -m venv v && pip install y\n```\nand `pip install` alone is prose.\n")
    assert printed_commands(text) == [("pip", "install", "-c", "c.txt", ".[x]"), ("pip", "install", "y"),
                                      ("pip", "install", "a[b]")]


#: ``python -m <module>`` and ``airflow <command>`` as printed; a path before them (``.venv/bin/python``) is the
#: checkout's venv (`make install`), where the repository's own modules (``tests.*``) exist too.
_PYTHON_M = re.compile(r"(?<![\w.-])(\S*/)?python[\d.]* -m ([A-Za-z_][\w.]*)")
_AIRFLOW = re.compile(r"(?<![\w./-])airflow ([a-z][\w-]*)")


def printed_run_commands(text: str) -> list[tuple[str, str]]:
    """``("python -m", module)`` and ``("airflow", command)`` as printed for any install (code blocks and inline
    code), leaving out those run from the checkout's venv."""
    code = [*_FENCE.findall(text), *re.findall(r"`([^`\n]+)`", _FENCE.sub("", text))]
    found = []
    for snippet in code:
        found += [("python -m", m.group(2)) for m in _PYTHON_M.finditer(snippet) if not m.group(1)]
        found += [("airflow", m.group(1)) for m in _AIRFLOW.finditer(snippet)]
    return found


def test_every_command_printed_for_an_install_exists_in_it() -> None:
    """A page tells a user who installed the wheel to run only what the wheel and its dependencies hold: the
    wheel's packages (pyproject's ``packages.find``), other installed modules (``venv``, ``build``) and Airflow's
    commands; the repository's ``tests.*`` only from the checkout's venv (``.venv/bin/python -m``)."""
    import setuptools
    from airflow.cli.cli_config import core_commands

    in_wheel = set(setuptools.find_packages(str(REPO), include=["airflow_jetstream*"]))
    airflow_commands = {command.name for command in core_commands}
    missing = []
    for page in doc_pages():
        for kind, name in printed_run_commands(page.read_text(encoding="utf-8")):
            top = name.split(".")[0]
            if kind == "airflow":
                exists = name in airflow_commands
            elif top == "airflow_jetstream":
                exists = name in in_wheel or name.rsplit(".", 1)[0] in in_wheel
            else:  # the standard library's or another distribution's
                exists = top in sys.stdlib_module_names or top in importlib.metadata.packages_distributions()
            if not exists:
                missing.append(f"{page.relative_to(REPO)}: {kind} {name}")
    assert not missing, f"commands the docs print that an install from the wheel does not have: {missing}"


def test_the_run_command_extraction_tells_the_checkout_apart() -> None:
    text = ("Run `python -m tests.x` or:\n\n```bash\n.venv/bin/python -m tests.y --help\npython3.11 -m venv v\n"
            "airflow standalone   # all in one\n```\n")
    assert printed_run_commands(text) == [("python -m", "venv"), ("airflow", "standalone"), ("python -m", "tests.x")]


def test_make_install_runs_the_printed_command() -> None:
    (command,) = [c for c, run in RUNS.items() if run.how == "make install"]
    dry = subprocess.run(["make", "-n", "-B", "install"], cwd=REPO, capture_output=True, text=True, timeout=60)
    ran = [tuple(a for a in shlex.split(line[line.find("pip install"):]) if a != "--quiet")
           for line in dry.stdout.splitlines() if "pip install" in line]
    assert command in ran, ran


# -- the install leg (.ci/compat): each command for real --------------------------------------------------

needs_leg = pytest.mark.skipif(not INSTALL_VENVS, reason="the install leg of `make compat` sets INSTALL_VENVS")


def user_pip_env(**extra: str) -> dict[str, str]:
    """pip's environment on a user's machine: no configuration file, no PIP_* variables, pip's own cache."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV", "AIRFLOW"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, **kwargs)


@dataclass
class Installed:
    command: tuple[str, ...]
    run: Run
    proc: subprocess.CompletedProcess
    seconds: float
    python: Path | None = None
    report: dict | None = None


def _checkout_copy(target: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) in ``target``, with the wheel in dist/ (make wheel)."""
    copy_checkout(target)
    built = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(target / "dist"), str(target)],
                 env=user_pip_env())
    assert built.returncode == 0, built.stderr[-3000:]
    assert (target / WHEEL).is_file(), sorted(p.name for p in (target / "dist").iterdir())
    return target


def _install(command: tuple[str, ...], run: Run, checkout: Path, venvs: Path) -> Installed:
    name = run.keep or re.sub(r"[^A-Za-z0-9]+", "-", " ".join(command[2:])).strip("-")
    venv = venvs / name
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", *command[1:]]
    env = user_pip_env()
    if any(arg.startswith("airflow-jetstream") for arg in command):
        env["PIP_FIND_LINKS"] = str(checkout / "dist")  # the wheel as the index's airflow-jetstream
    report = None
    if run.how == "resolve":
        pip[4:4] = ["--dry-run", "--quiet", "--report", str(venv / "report.json")]
    proc = _run(pip, cwd=checkout, env=env)
    if proc.returncode == 0 and run.how == "resolve":
        report = json.loads((venv / "report.json").read_text())
    if proc.returncode == 0 and run.keep:
        tools = _run([str(python), "-m", "pip", "install", "--quiet", "pytest", "pytest-timeout"], env=user_pip_env())
        assert tools.returncode == 0, tools.stderr[-3000:]
    return Installed(command, run, proc, time.monotonic() - started, python, report)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], Installed]:
    """Every venv/resolve command of RUNS, run (PARALLEL at a time) into fresh venvs under $INSTALL_VENVS."""
    venvs = Path(INSTALL_VENVS or "").absolute()
    venvs.mkdir(parents=True, exist_ok=True)
    checkout = _checkout_copy(tmp_path_factory.mktemp("checkout"))
    todo = [(c, r) for c, r in RUNS.items() if r.how in ("venv", "resolve")]
    with ThreadPoolExecutor(PARALLEL) as pool:
        done = list(pool.map(lambda item: _install(*item, checkout, venvs), todo))
    for result in done:
        print(f"{' '.join(result.command)}: {result.seconds:.0f} s")
    return {result.command: result for result in done}


def _in_venv(python: Path, script: str, tmp_path: Path) -> dict:
    env = user_pip_env(AIRFLOW_HOME=str(tmp_path / "airflow-home"), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    proc = _run([str(python), "-c", script], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_FACTS = """
import importlib.metadata as m, json, sys
from pathlib import Path
import airflow_jetstream
from airflow.providers_manager import ProvidersManager
names = ("apache-airflow", "nats-py", "pyspark", "pyspark-client", "apache-airflow-providers-apache-spark")
facts = {"versions": {}, "package": airflow_jetstream.__file__, "prefix": sys.prefix}
for name in names:
    try:
        facts["versions"][name] = m.version(name)
    except m.PackageNotFoundError:
        pass
manager = ProvidersManager()
facts["provider"] = manager.providers["airflow-jetstream"].version
facts["nats_hook"] = manager.hooks["nats"].hook_class_name
if "pyspark" in facts["versions"]:
    import pyspark.version
    from airflow_jetstream.spark.package import check_pyspark_install
    check_pyspark_install()
    jars = Path(pyspark.version.__file__).parent / "jars"
    facts["python_side"] = pyspark.version.__version__
    facts["jars"] = sorted(p.name for p in jars.glob("spark-core_*.jar"))
print(json.dumps(facts))
"""


def _ids(items: dict) -> list[str]:
    return [" ".join(c) for c in items]


VENV_RUNS = {c: r for c, r in RUNS.items() if r.how == "venv"}
RESOLVE_RUNS = {c: r for c, r in RUNS.items() if r.how == "resolve"}


@needs_leg
@pytest.mark.parametrize("command", list(VENV_RUNS), ids=_ids(VENV_RUNS))
def test_the_printed_install_works_in_a_fresh_venv(command, installed, tmp_path: Path) -> None:
    result = installed[command]
    assert result.proc.returncode == 0, result.proc.stdout[-2000:] + result.proc.stderr[-3000:]
    checked = _run([str(result.python), "-m", "pip", "check"], env=user_pip_env())
    assert checked.returncode == 0, checked.stdout
    facts = _in_venv(result.python, _FACTS, tmp_path)
    print(f"{' '.join(command)}: {facts['versions']}")
    assert Path(facts["package"]).is_relative_to(facts["prefix"]), "the installed package, not the checkout"
    assert facts["provider"] == __version__
    assert facts["nats_hook"] == "airflow_jetstream.hooks.jetstream.JetStreamHook"
    versions = facts["versions"]
    assert versions["nats-py"].startswith("2.16."), "the newest nats-py the range allows"
    if result.run.spark:
        assert versions["pyspark"] == versions["pyspark-client"], versions
        assert facts["jars"] == [f"spark-core_2.13-{facts['python_side']}.jar"], facts
    if result.run.nats_only:
        assert not {"pyspark", "pyspark-client", "apache-airflow-providers-apache-spark"} & set(versions), versions
        probe = _run([str(result.python), str(REPO / "tests" / "support" / "nats_only_probe.py"),
                      str(REPO / "dags_examples")], cwd=tmp_path,
                     env=user_pip_env(AIRFLOW_HOME=str(tmp_path / "airflow-home"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                                      PYTHONPATH=str(REPO / "dags_examples")))
        assert probe.returncode == 0, probe.stderr[-3000:]
        from tests.test_spark_optional import assert_nats_only_install_works

        assert_nats_only_install_works(json.loads(probe.stdout.strip().splitlines()[-1]),
                                       messaging="messaging" in " ".join(command))
    if result.run.user_tests:
        from tests.test_testing_module import USER_TESTS

        users = tmp_path / "users-project"
        users.mkdir()
        (users / "conftest.py").write_text('pytest_plugins = ["airflow_jetstream.testing"]\n')
        (users / "test_user_dag.py").write_text(textwrap.dedent(USER_TESTS))
        ran = _run([str(result.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(users)], cwd=users,
                   env=user_pip_env(AIRFLOW_HOME=str(tmp_path / "airflow-home")))
        assert ran.returncode == 0 and "2 passed" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-2000:]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / CONSTRAINTS).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


@needs_leg
@pytest.mark.parametrize("command", list(RESOLVE_RUNS), ids=_ids(RESOLVE_RUNS))
def test_the_printed_pinned_install_resolves_to_the_pins(command, installed) -> None:
    result = installed[command]
    assert result.proc.returncode == 0, result.proc.stderr[-3000:]
    chosen = {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item["metadata"]["version"]
              for item in result.report["install"]}
    pins = _pins()
    off = {name: (version, pins[name]) for name, version in chosen.items() if name in pins and pins[name] != version}
    assert not off, f"resolved away from the constraints file: {off}"
    assert chosen.pop("airflow-jetstream") == __version__
    unpinned = sorted(set(chosen) - set(pins))
    assert not unpinned, f"the constraints file does not pin {unpinned}: run `make constraints`"
    if "pyspark" in chosen:
        assert chosen["pyspark"] == chosen["pyspark-client"]

"""Every fenced block in docs/ runs as written (docs/index.md, "Docs snippets", has the convention).

Every page runs against ONE nats-server, pages in the order of the site's navigation, as a reader
who follows the docs on one server would (URL in NATS_URL and ``nats_default``): a page that collides
with an earlier one (a stream name, overlapping subjects, a msg id) fails. Per page: a fresh
namespace, blocks in page order. Python blocks are executed (later blocks may use names from earlier ones of the same
page); a block that defines a DAG is run with ``dag.test()`` in one shared Airflow process; json/text
blocks are compared with the real XCom/log; the page's shell blocks run as one bash script at the
end. Only blocks marked ``<!-- fragment: <reason> -->`` are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.embedded.server import free_port
from tests.support.airflow_cli import isolated_airflow_env, nats_conn_json
from tests.support.docs_dag_runner import MARKER
from tests.support.docs_snippets import (
    Block,
    assert_matches,
    malformed_markers,
    normalise_log_line,
    parse_blocks,
)

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _nav_order() -> list[str]:
    """Every page, in the order of mkdocs.yml's navigation (pages outside it last, sorted)."""
    listed = re.findall(r"([\w/.-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    return [p for p in dict.fromkeys(listed) if p in pages] + [p for p in pages if p not in listed]


PAGES = _nav_order()
RUNNABLE = {"python", "json", "bash", "shell", "text"}


class DagRunner:
    """The tests/support/docs_dag_runner.py process: one Airflow import and migration per session."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._start()

    def _start(self) -> None:
        home = self.home
        (home / "dags").mkdir(parents=True, exist_ok=True)
        env = isolated_airflow_env(home, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.docs_dag_runner"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        # A thread reads the output line by line: select() on the pipe does not see lines already in the text
        # stream's buffer (the answer could sit there behind a log line read in the same chunk, never "ready").
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_lines, args=(self.proc.stdout, self.lines), daemon=True).start()
        self._answer(timeout=240)

    @staticmethod
    def _read_lines(stdout: Any, lines: queue.Queue[str | None]) -> None:
        for line in stdout:
            lines.put(line)
        lines.put(None)  # the runner exited

    def _answer(self, timeout: float) -> tuple[dict[str, Any], list[str]]:
        deadline = time.monotonic() + timeout
        log: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the DAG runner gave no answer in {timeout}s:\n" + "".join(log[-40:])) from None
            if line is None:
                raise AssertionError("the DAG runner exited:\n" + "".join(log[-40:]))
            if line.startswith(MARKER):
                return json.loads(line[len(MARKER):]), log
            log.append(line)

    def run(self, source: str, name: str, nats_url: str) -> tuple[dict[str, Any], list[str]]:
        request = {"source": source, "name": name, "nats_url": nats_url, "conn": nats_conn_json(nats_url)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        try:
            return self._answer(timeout=120)
        except AssertionError:
            self.close()  # a DAG that never ends: the next page gets a fresh runner
            self._start()
            raise

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20 if self.proc.poll() is not None else 5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    """The one server every page runs against, in navigation order."""
    with EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("docs-nats")) as server:
        yield server


@pytest.fixture(scope="module")
def dag_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagRunner]:
    runner = DagRunner(tmp_path_factory.mktemp("docs-airflow"))
    yield runner
    runner.close()


@contextlib.contextmanager
def _time_limit(seconds: int, where: str) -> Iterator[None]:
    """Fail a snippet that does not finish (SIGALRM: pytest runs tests in the main thread)."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{where}: the snippet ran for more than {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _where(page: str, block: Block) -> str:
    return f"docs/{page}:{block.line}"


def _run_shell(page: str, script: str, workdir: Path) -> None:
    """The page's shell blocks as one script: an isolated Airflow home, NATS_PORT a free port, the
    venv first on PATH; every process the script leaves behind is stopped with its process group."""
    env = isolated_airflow_env(workdir / "airflow_home", dags_folder=workdir / "dags",
                               NATS_PORT=str(free_port()), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    output = workdir / "shell-output.txt"
    with output.open("w") as sink:
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=workdir, env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=600)  # not its background children (a server the page starts with &)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    assert proc.returncode == 0, f"docs/{page}: the shell blocks failed:\n{output.read_text()[-4000:]}"


def test_every_marker_follows_the_convention() -> None:
    bad = {page: malformed_markers((DOCS / page).read_text()) for page in PAGES}
    assert {page: lines for page, lines in bad.items() if lines} == {}


def test_every_block_is_runnable_or_a_fragment() -> None:
    """A block in a language the suite does not run must say why it is a fragment."""
    unrunnable = [f"docs/{page}:{block.line} ({block.lang or 'no language'})"
                  for page in PAGES for block in parse_blocks((DOCS / page).read_text())
                  if block.marker != "fragment" and block.lang not in RUNNABLE]
    assert unrunnable == []


def _page_param(page: str) -> Any:
    """A page whose shell blocks call the airflow CLI is marked like the other CLI tests."""
    blocks = [b for b in parse_blocks((DOCS / page).read_text()) if b.marker != "fragment"]
    cli = any(b.lang in ("bash", "shell") and "airflow " in b.code for b in blocks)
    return pytest.param(page, marks=[pytest.mark.airflow_cli] if cli else [])


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if any(
    b.marker != "fragment" for b in parse_blocks((DOCS / p).read_text()))])
def test_page_snippets_run_as_written(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      request: pytest.FixtureRequest, docs_server: EmbeddedNatsServer) -> None:
    blocks = [b for b in parse_blocks((DOCS / page).read_text()) if b.marker != "fragment"]
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    outputs: dict[str, Any] = {}
    last_log: list[str] = []
    shell: list[str] = []
    server = docs_server  # shared by every page: a collision with an earlier page fails here
    monkeypatch.setenv("NATS_URL", server.url)
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", nats_conn_json(server.url))
    for block in blocks:
        where = _where(page, block)
        if block.marker == "file":
            target = workdir / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
        elif block.lang in ("bash", "shell"):
            shell.append(f"# {where}\n{block.code}")
        elif block.is_dag:
            runner: DagRunner = request.getfixturevalue("dag_runner")
            answer, last_log = runner.run(block.code, f"doc_{block.line}", server.url)
            assert "runs" in answer, f"{where}: {answer}\n{''.join(last_log[-60:])}"
            for dag_id, run in answer["runs"].items():
                assert run["state"] == "success", f"{where}: DAG {dag_id} {run}\n{''.join(last_log[-80:])}"
                outputs.update({task: ti["xcom"] for task, ti in run["tasks"].items()})
        elif block.lang == "python":
            with _time_limit(120, where):
                exec(compile(block.code, where, "exec"), namespace)
        elif block.lang == "json":
            assert block.marker == "output", f"{where}: a json block needs <!-- output: name --> or a fragment"
            real = outputs[block.arg] if block.arg in outputs else namespace[block.arg]
            assert_matches(json.loads(block.code), real, block.varies, where)
        elif block.lang == "text":
            assert block.marker == "log", f"{where}: a text block needs <!-- log: task -->, or a fragment"
            seen = [normalise_log_line(line) for line in last_log]
            for shown in block.code.strip().splitlines():
                wanted = normalise_log_line(shown)
                assert any(wanted in line for line in seen), f"{where}: not in the real log: {shown}"
    if shell:
        _run_shell(page, "\n".join(shell), workdir)

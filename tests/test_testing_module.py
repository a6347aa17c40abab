"""airflow_jetstream.testing: pytest fixtures users enable for their own DAG tests; no runtime code imports it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import airflow_jetstream

PACKAGE = Path(airflow_jetstream.__file__).parent
FOR_TESTS_ONLY = ("airflow_jetstream.embedded", "airflow_jetstream.testing")

USER_TESTS = '''
from airflow_jetstream.client import ConnectionSettings, stream_info
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator


def test_a_users_task_against_a_real_server(jetstream_conn_id):
    op = JetStreamEnsureStreamOperator(task_id="ensure", nats_conn_id=jetstream_conn_id,
                                       config={"name": "ORDERS", "subjects": ["orders.>"]})
    assert op.execute({})["action"] == "created"


def test_the_server_lives_for_the_session(jetstream_conn_id, jetstream_server):
    hook = JetStreamHook(nats_conn_id=jetstream_conn_id)
    assert hook.get_settings().servers == (jetstream_server.url,)
    assert hook.run(stream_info, "ORDERS")["config"]["subjects"] == ["orders.>"]
'''


def _runtime_modules() -> list[Path]:
    return [path for path in PACKAGE.rglob("*.py")
            if "embedded" not in path.relative_to(PACKAGE).parts and path.name != "testing.py"]


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_runtime_code_imports_the_test_servers():
    offenders = {str(path.relative_to(PACKAGE)): sorted(name for name in _imported(path)
                                                        if name.startswith(FOR_TESTS_ONLY))
                 for path in _runtime_modules()}
    assert len(offenders) > 40  # the scan saw the package
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_fixtures_give_a_users_tests_a_real_server(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["airflow_jetstream.testing"]\n')
    (tmp_path / "test_user_dag.py").write_text(textwrap.dedent(USER_TESTS))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout

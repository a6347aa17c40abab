"""A long-lived Airflow process that runs documentation DAG snippets with ``dag.test()``.

Started once per test session by tests/test_docs_snippets.py with an isolated Airflow home: it
migrates the database once, then for each request (one JSON line on stdin: the snippet's source and
the ``nats_default`` connection) writes the snippet as the only file of the DAGs folder, parses it
with a DagBag (import errors are reported) and runs every DAG it defines with ``dag.test()``, the
code path of ``airflow dags test``. The answer is one stdout line starting with ``MARKER``: each
task's state and returned XCom. Everything else printed in between is the task logs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

MARKER = "@@DOCS-DAG-RUNNER@@ "


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _run(source: str, conn: str, nats_url: str, name: str) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    os.environ["AIRFLOW_CONN_NATS_DEFAULT"] = conn
    os.environ["NATS_URL"] = nats_url
    dags_folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    for old in dags_folder.glob("*.py"):
        old.unlink()
    path = dags_folder / f"{name}.py"
    path.write_text(source)
    bag = DagBag(dag_folder=str(path))
    if bag.import_errors:
        return {"import_errors": {k: str(v) for k, v in bag.import_errors.items()}}
    runs: dict[str, Any] = {}
    for dag_id, dag in bag.dags.items():
        run = dag.test()
        tasks = {}
        for ti in run.get_task_instances():
            tasks[ti.task_id] = {"state": str(ti.state), "xcom": _jsonable(ti.xcom_pull(task_ids=ti.task_id))}
        runs[dag_id] = {"state": str(run.state), "tasks": tasks}
    return {"runs": runs}


def main() -> None:
    from airflow.utils import db

    db.initdb()
    print(MARKER + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = _run(request["source"], request["conn"], request["nats_url"], request["name"])
        except Exception as exc:  # reported to the test, which fails with it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(MARKER + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()

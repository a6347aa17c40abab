"""Layer rules and install traps."""

from __future__ import annotations

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
    assert offenders == []


def test_pyspark_python_files_match_its_jars():
    """pyspark-client (pulled in by the Spark provider) shares pyspark's files: versions must agree."""
    import pyspark

    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-core_*.jar"))
    assert jars, "pyspark jars missing: pyspark was overwritten or removed"
    jar_version = re.search(r"spark-core_[\d.]+-(.+)\.jar$", jars[0]).group(1)
    assert pyspark.__version__ == jar_version

"""What importing the provider costs, each in a fresh interpreter (best of N runs; docs/performance.md).

Prints, per import: the whole process (minus a bare interpreter's start) and the import itself as
``python -X importtime`` reports it, and whether nats-py was imported; then ratios against the baselines
in the same run: a bare interpreter for the provider info, Airflow's own ``SparkSubmitOperator`` for the
Spark operator. With ``--baseline-tree DIR`` (another checkout of the repository, e.g. the previous
release) every provider import is also measured from that tree, interleaved, and compared.

    python bench/import_cost.py [--runs 7] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

IMPORTS = {
    "bare interpreter": "pass",
    "provider info": "from airflow_jetstream.get_provider_info import get_provider_info; get_provider_info()",
    "airflow.sdk": "import airflow.sdk",
    "SparkSubmitOperator (Airflow's)": "import airflow.providers.apache.spark.operators.spark_submit",
    "JetStreamSparkSubmitOperator": "import airflow_jetstream.operators.spark_submit",
    "JetStreamEnsureStreamOperator": "import airflow_jetstream.operators.stream",
    "JetStreamMessageSensor": "import airflow_jetstream.sensors.message",
    "the example DAGs' 13 operators and sensors": "; ".join(f"import airflow_jetstream.{module}" for module in (
        "operators.advisory", "operators.consume", "operators.consumer", "operators.kv", "operators.publish",
        "operators.sourcing", "operators.spark_submit", "operators.stream", "sensors.advisory", "sensors.consumer",
        "sensors.kv", "sensors.ledger", "sensors.message")),
    "nats-py": "import nats, nats.js",
    "pyspark.sql": "import pyspark.sql",
}
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\S.*)")  # top-level imports (no indentation)
_ANY = re.compile(r"import time:\s+(\d+) \|\s+\d+ \| +(\S+)")
_OWN = ("airflow_jetstream", "nats")


def measure(code: str, tree: str | None = None) -> tuple[float, float, float, bool]:
    """Of one fresh interpreter (importing the provider from ``tree`` when given): whole process seconds,
    top-level import seconds and the seconds spent in the provider's and nats-py's own modules (their
    self times) from -X importtime, and whether nats-py was imported."""
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    code = f"{code}\nimport sys; print('nats' in sys.modules)"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          check=True, timeout=300, env=env, cwd=tree)  # -c puts the cwd first on sys.path
    whole = time.perf_counter() - started
    lines = proc.stderr.splitlines()
    baseline = {"site", "encodings", "_frozen_importlib_external", "zipimport", "codecs", "io", "abc"}
    imports = sum(int(m.group(2)) for m in map(_LINE.match, lines)
                  if m and m.group(3) not in baseline and not m.group(3).startswith(("encodings", "_")))
    own = sum(int(m.group(1)) for m in map(_ANY.match, lines)
              if m and m.group(2).split(".")[0] in _OWN)
    return whole, imports / 1e6, own / 1e6, proc.stdout.strip().endswith("True")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline-tree", help="a checkout whose provider imports are measured for comparison")
    args = parser.parse_args()
    rows = {name: (code, None) for name, code in IMPORTS.items()}
    if args.baseline_tree:
        tree = os.path.abspath(args.baseline_tree)
        rows |= {f"{name} (baseline)": (code, tree) for name, code in IMPORTS.items() if "airflow_jetstream" in code}
    best: dict[str, tuple[float, float, float, bool]] = {}
    for _ in range(args.runs):  # interleaved, so a load spike hits every row alike
        for name, (code, tree) in rows.items():
            whole, imports, own, nats = measure(code, tree)
            prev = best.get(name, (whole, imports, own, nats))
            best[name] = (min(prev[0], whole), min(prev[1], imports), min(prev[2], own), nats)
    bare = best["bare interpreter"][0]
    print(f"best of {args.runs} fresh interpreters; process = whole process minus a bare one ({bare * 1000:.0f} ms); "
          "own = self time of the airflow_jetstream and nats modules")
    for name, (whole, imports, own, nats) in best.items():
        if name != "bare interpreter":
            print(f"{name:52} process {1000 * (whole - bare):6.0f} ms  -X importtime {1000 * imports:6.0f} ms  "
                  f"own {1000 * own:5.0f} ms{'  imports nats-py' if nats else ''}")
    for name in IMPORTS:
        if f"{name} (baseline)" in best:
            (_, now, own_now, _), (_, before, own_before, _) = best[name], best[f"{name} (baseline)"]
            print(f"{name:52} this tree / baseline: import x{now / before:.2f} ({1000 * (now - before):+.0f} ms), "
                  f"own x{own_now / own_before:.2f} ({1000 * (own_now - own_before):+.0f} ms)")
    spark, plain = best["JetStreamSparkSubmitOperator"][1], best["SparkSubmitOperator (Airflow's)"][1]
    print(f"JetStreamSparkSubmitOperator / SparkSubmitOperator import: x{spark / plain:.2f}")
    print(f"provider info import: {1000 * best['provider info'][1]:.1f} ms (budget 60 ms)")


if __name__ == "__main__":
    main()

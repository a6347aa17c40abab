"""What importing the provider costs, each in a fresh interpreter (best of N runs; docs/performance.md).

Prints, per import: the whole process (minus a bare interpreter's start) and the import itself as
``python -X importtime`` reports it; then ratios against the baselines in the same run: a bare
interpreter for the provider info, Airflow's own ``SparkSubmitOperator`` for the Spark operator.

    python bench/import_cost.py [--runs 7]
"""

from __future__ import annotations

import argparse
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
    "nats-py": "import nats, nats.js",
    "pyspark.sql": "import pyspark.sql",
}
_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)")


def measure(code: str) -> tuple[float, float]:
    """(whole process seconds, top-level import seconds from -X importtime) of one fresh interpreter."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          check=True, timeout=300)
    whole = time.perf_counter() - started
    baseline = {"site", "encodings", "_frozen_importlib_external", "zipimport", "codecs", "io", "abc"}
    imports = sum(int(m.group(1)) for m in map(_LINE.match, proc.stderr.splitlines())
                  if m and m.group(2) not in baseline and not m.group(2).startswith(("encodings", "_")))
    return whole, imports / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    best: dict[str, tuple[float, float]] = {}
    for _ in range(runs):  # interleaved, so a load spike hits every row alike
        for name, code in IMPORTS.items():
            whole, imports = measure(code)
            prev = best.get(name, (whole, imports))
            best[name] = (min(prev[0], whole), min(prev[1], imports))
    bare = best["bare interpreter"][0]
    print(f"best of {runs} fresh interpreters; process = whole process minus a bare one ({bare * 1000:.0f} ms)")
    for name, (whole, imports) in best.items():
        if name != "bare interpreter":
            print(f"{name:34} process {1000 * (whole - bare):7.0f} ms   -X importtime {1000 * imports:7.0f} ms")
    spark, plain = best["JetStreamSparkSubmitOperator"][1], best["SparkSubmitOperator (Airflow's)"][1]
    print(f"JetStreamSparkSubmitOperator / SparkSubmitOperator import: x{spark / plain:.2f}")
    print(f"provider info import: {1000 * best['provider info'][1]:.1f} ms (budget 60 ms)")


if __name__ == "__main__":
    main()

"""The chaos suite's seeded CI subset (e2e tier): one short run, failing on any lost, duplicated,
partly stored or misreported write. ``make chaos`` runs the long version (docs/reliability.md).

It runs in a subprocess: the run moves its thread into a network namespace and owns the servers;
on its time limit it gets SIGTERM and cleans up, and whatever is left of its namespaces is removed here.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.chaos.nemesis import KINDS
from tests.chaos.network import leftover_namespaces, remove_leftovers

ROOT = Path(__file__).resolve().parents[2]
#: Seed 144 draws each of the six fault kinds once.
SEED, FAULTS = 144, 6
#: Faults whose client defect (issue 21) is not fixed yet stay out of the CI subset, and the output says so.
LEFT_OUT: dict[str, str] = {}
LIMIT = 300


def test_chaos_subset(tmp_path: Path) -> None:
    kinds = [k for k in KINDS if k not in LEFT_OUT]
    for kind, why in LEFT_OUT.items():
        print(f"left out of the CI subset: {kind} ({why})")
    out = tmp_path / "chaos.json"
    command = [sys.executable, "-m", "tests.chaos", "--seeds", str(SEED), "--faults", str(FAULTS),
               "--kinds", ",".join(kinds), "--json", str(out), "--log", str(tmp_path / "client.log")]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        remove_leftovers(str(proc.pid))
    print(output)
    assert not leftover_namespaces(str(proc.pid))
    assert out.exists(), f"the chaos run ended without results (exit {proc.returncode}):\n{output[-3000:]}"
    [run] = json.loads(out.read_text())
    assert run["faults"] and run["ops"] > 0, output
    counts = {k: run[k] for k in ("lost", "duplicated", "partial", "misreported")}
    assert counts == dict.fromkeys(counts, 0), output

"""``python -m tests.chaos``: seeded chaos runs against a 3-node cluster, one table row per seed.

Exit status 1 when any run lost, duplicated, partly stored or misreported a write, or an operation
took longer than ``leader_wait`` + 15 s. ``make chaos`` runs three seeds of 15 faults each.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from tests.chaos import workloads
from tests.chaos.nemesis import KINDS
from tests.chaos.runner import RunConfig, RunResult, run

COLUMNS = ("seed", "faults", "ops", "msgs", "lost", "dup", "partial", "misrep", "mislead", "unknown",
           "slowest s", "late", "diverged", "run s")
SHOWN_DETAILS = 12


def _row(result: RunResult) -> list[str]:
    r = result.report
    return [str(result.config.seed), str(r.faults), str(r.ops), str(r.messages), str(r.lost), str(r.duplicated),
            str(r.partial), str(r.misreported), str(r.misleading), str(r.unknown), f"{r.slowest:.1f}",
            str(r.late), str(r.diverged), f"{result.seconds:.0f}"]


def table(results: list[RunResult]) -> str:
    rows = [list(COLUMNS), ["---"] * len(COLUMNS), *(_row(r) for r in results)]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def describe(result: RunResult) -> str:
    r = result.report
    lines = [f"seed {result.config.seed} on {result.network}; workloads {', '.join(result.config.workloads)}",
             "  faults: " + "; ".join(f.describe(result.t0) for f in result.faults),
             f"  slowest op: {r.slowest_op}",
             "  failures: " + (", ".join(f"{k} x{v}" for k, v in sorted(r.failures.items())) or "none")]
    lines += [f"  {d}" for d in r.details[:SHOWN_DETAILS]]
    if len(r.details) > SHOWN_DETAILS:
        lines.append(f"  ... and {len(r.details) - SHOWN_DETAILS} more")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--faults", type=int, default=15, help="faults per seed")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, from {','.join(KINDS)}")
    parser.add_argument("--workloads", default=",".join(workloads.WORKLOADS))
    parser.add_argument("--leader-wait", type=float, default=30.0)
    parser.add_argument("--loopback", action="store_true", help="no network namespaces (partitions become SIGSTOP)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--log", help="write the client's log (warnings and up) to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.log else logging.CRITICAL, filename=args.log,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS) or set(args.workloads.split(",")) - set(workloads.WORKLOADS)
    if unknown:
        parser.error(f"unknown fault kinds or workloads: {sorted(unknown)}")
    left_out = [k for k in KINDS if k not in kinds]
    if left_out:
        print(f"faults left out of this run: {', '.join(left_out)}", flush=True)
    # A SIGTERM (e.g. a test's time limit) unwinds through the clean-up of the running seed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    for seed in args.seeds:
        config = RunConfig(seed, args.faults, kinds, tuple(args.workloads.split(",")),
                           namespaces=not args.loopback, leader_wait=args.leader_wait)
        result = run(config)
        results.append(result)
        print(describe(result), flush=True)
    print(table(results), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{"seed": r.config.seed, "network": r.network, "seconds": r.seconds,
                        "faults": [f.describe(r.t0) for f in r.faults], **r.report.to_dict()} for r in results], out)
    bad = [r for r in results if r.report.violations or r.report.late]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU time of another process, for the benchmarks' per-message server CPU columns (Linux ``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every process below it, with the children they already reaped (Spark's JVM
    and its Python workers below a bench): on a loaded box this moves far less than wall time does."""
    parents: dict[int, int] = {}
    spent: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents[int(entry.name)] = int(fields[1])
        spent[int(entry.name)] = sum(int(value) for value in fields[11:15]) / tick
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, its_parent in parents.items() if its_parent == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(spent.get(member, 0.0) for member in tree)

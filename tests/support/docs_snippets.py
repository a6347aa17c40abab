"""Fenced code blocks of the docs and the markers that say how the docs test treats them.

A marker is an HTML comment on the line right before a block's opening fence:
``<!-- fragment: <reason> -->`` (not executed; the reason is required),
``<!-- file: <relative path> -->`` (written to the page's working directory for its shell blocks),
``<!-- output: <task id or variable>[; varies: key, key] -->`` (a json block: the real value),
``<!-- log: <task id> -->`` (a text block: lines the task's log contains).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

FENCE = re.compile(r"^```([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(fragment|file|output|log)\b:?(.*?)-->\s*$")
DAG_DEFINITION = re.compile(r"^\s*(with DAG\(|@dag\b)|=\s*DAG\(", re.M)
HEX_ID = re.compile(r"\b[0-9a-f]{12,}\b")


@dataclass
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    marker: str = ""  # fragment / file / output / log / "" (none)
    arg: str = ""
    varies: set[str] = field(default_factory=set)

    @property
    def is_dag(self) -> bool:
        return self.lang == "python" and bool(DAG_DEFINITION.search(self.code))


def parse_blocks(text: str) -> list[Block]:
    """Every fenced block of a markdown page with its marker (if the previous line is one)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        block = Block(lang=opening.group(1).lower(), code="\n".join(lines[i + 1:end]) + "\n", line=i + 1)
        previous = lines[i - 1].strip() if i else ""
        marker = MARKER.match(previous)
        if marker:
            block.marker, arg = marker.group(1), marker.group(2).strip()
            if block.marker == "output" and ";" in arg:
                arg, _, rest = arg.partition(";")
                block.varies = {k.strip() for k in rest.split(":", 1)[-1].split(",") if k.strip()}
            block.arg = arg.strip()
        blocks.append(block)
        i = end + 1
    return blocks


def malformed_markers(text: str) -> list[str]:
    """Marker-like comments that do not follow the convention (a fragment without a reason...)."""
    bad = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("<!--") and re.search(r"\b(fragment|output|file|log)\b", stripped):
            marker = MARKER.match(stripped)
            if not marker or not marker.group(2).strip(" :"):
                bad.append(f"line {number}: {stripped}")
    return bad


def _kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value) if value is None else "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def assert_matches(shown: Any, real: Any, varies: set[str], path: str = "$") -> None:
    """The shown JSON equals the real value, except keys named in ``varies`` (same kind of value)
    and ``"..."`` placeholders (a ``"...": "..."`` member leaves a dict open for more keys)."""
    if shown == "...":
        return
    if isinstance(shown, dict):
        assert isinstance(real, dict), f"{path}: shown an object, real {real!r}"
        keys = set(shown) - {"..."}
        if "..." in shown:
            assert keys <= set(real), f"{path}: shown keys {sorted(keys - set(real))} not in the real output"
        else:
            assert keys == set(real), (f"{path}: keys differ: only shown {sorted(keys - set(real))}, "
                                       f"only real {sorted(set(real) - keys)}")
        for key in keys:
            if key in varies:
                assert _kind(shown[key]) == _kind(real[key]), f"{path}.{key}: shown {shown[key]!r}, real {real[key]!r}"
            else:
                assert_matches(shown[key], real[key], varies, f"{path}.{key}")
        return
    if isinstance(shown, list) and isinstance(real, list):
        if shown and shown[-1] == "...":
            shown = shown[:-1]
            real = real[:len(shown)]
        assert len(shown) == len(real), f"{path}: shown {shown!r}, real {real!r}"
        for index, (a, b) in enumerate(zip(shown, real, strict=True)):
            assert_matches(a, b, varies, f"{path}[{index}]")
        return
    assert shown == real, f"{path}: shown {shown!r}, real {real!r}"


def normalise_log_line(line: str) -> str:
    return HEX_ID.sub("<id>", line.strip())

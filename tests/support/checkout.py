"""A copy of this checkout as a user's clone would have it: its files (tracked and new, not ignored)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def copy_checkout(target: Path, *, git: bool = False) -> Path:
    """Copy the checkout's files (tracked and new, not ignored: uncommitted changes too) into ``target``; with
    ``git``, make it a repository whose one commit holds them all, so ``git status`` shows what runs add."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True, timeout=60).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    if git:
        for command in (["init", "--quiet"], ["add", "--all"], ["commit", "--quiet", "--message", "copy"]):
            subprocess.run(["git", "-c", "user.name=tests", "-c", "user.email=tests@localhost", *command],
                           cwd=target, check=True, capture_output=True, timeout=120)
    return target


def git_status(checkout: Path) -> str:
    """``git status --porcelain`` of ``checkout``: empty when nothing but ignored files changed."""
    return subprocess.run(["git", "status", "--porcelain"], cwd=checkout, capture_output=True, text=True, check=True,
                          timeout=60).stdout

"""Kill a process started in its own session together with everything it started (bounded)."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def kill_process_tree(pid: int, timeout: float = 30.0) -> list[int]:
    """SIGKILL process ``pid`` (a session leader), its process group and every descendant; return their pids.

    The tree is frozen first (SIGSTOP to the group, then to each descendant, which may have a group of its
    own, as pyspark's worker daemon does), so none of them starts another process in between; then every
    one of them is killed. Fails when one survives ``timeout`` seconds.
    """
    root = psutil.Process(pid)
    os.killpg(pid, signal.SIGSTOP)
    tree = {root.pid: root}
    for _ in range(2):  # a child forked before its parent stopped shows up in the second look
        for process in list(tree.values()):
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in process.children(recursive=True):
                    tree.setdefault(child.pid, child)
                    child.send_signal(signal.SIGSTOP)
    os.killpg(pid, signal.SIGKILL)
    for process in tree.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    _, alive = psutil.wait_procs(list(tree.values()), timeout=timeout)
    assert not alive, f"processes survived SIGKILL: {[p.pid for p in alive]}"
    return sorted(tree)

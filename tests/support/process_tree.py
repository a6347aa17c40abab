"""Kill a process started in its own session together with everything it started (bounded)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil


def kill_process_tree(leader: subprocess.Popen, timeout: float = 30.0) -> dict[int, str]:
    """SIGKILL ``leader`` (started with ``start_new_session=True``), its process group and every descendant;
    reap ``leader`` and return the name of each of them by pid.

    The tree is frozen first (SIGSTOP to the group, then to each descendant, which may have a group of its
    own, as pyspark's worker daemon does), so none of them starts another process in between; then every
    one of them is killed. Fails when one survives ``timeout`` seconds.
    """
    pid = leader.pid
    os.killpg(pid, signal.SIGSTOP)
    tree: dict[int, psutil.Process] = {pid: psutil.Process(pid)}
    names = {pid: tree[pid].name()}
    for _ in range(2):  # a child forked before its parent stopped shows up in the second look
        for process in list(tree.values()):
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in process.children(recursive=True):
                    tree.setdefault(child.pid, child)
                    names.setdefault(child.pid, child.name())
                    child.send_signal(signal.SIGSTOP)
    os.killpg(pid, signal.SIGKILL)
    for process in tree.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    leader.wait(timeout)
    _, alive = psutil.wait_procs([p for p in tree.values() if p.pid != pid], timeout=timeout)
    running = [p.pid for p in alive if _running(p)]  # a zombie is dead: its new parent may not reap it
    assert not running, f"processes survived SIGKILL: {running}"
    return names


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

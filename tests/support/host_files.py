"""What a host of tests/infra/hosts.py may write, asked from inside it: the writable mounts its processes reach (from
``/proc/self/mountinfo``) and, for each folder given, whether a new file can be made there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.infra.hosts import Host

#: Run on the host: ``python -c PROBE <file name> <folders to keep it in> <folders to try>`` (the lists as JSON)
#: prints ``{"writable": [mount points], "writes": {folder: "written" or the errno's name}}``. A file made in a folder
#: to keep it in stays there (the caller checks where it landed); one made where it was only tried is removed at
#: once. A mount point counts when the mount its path reaches is writable (statvfs): a mount hidden under another is
#: not reachable.
PROBE = r"""
import errno, json, os, sys
name, keep, tried = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
points = set()
with open("/proc/self/mountinfo") as mountinfo:
    for line in mountinfo:
        points.add(line.split()[4].encode().decode("unicode_escape"))  # \040 is a space
writable = []
for point in sorted(points):
    try:
        if not os.statvfs(point).f_flag & os.ST_RDONLY:
            writable.append(point)
    except OSError:
        pass
writes = {}
for folder in keep + tried:
    path = os.path.join(folder, name)
    try:
        with open(path, "x") as made:
            made.write(name)
    except OSError as exc:
        writes[folder] = errno.errorcode.get(exc.errno, str(exc.errno))
        continue
    writes[folder] = "written"
    if folder not in keep:
        os.unlink(path)
print(json.dumps({"writable": writable, "writes": writes}))
"""


def run_on(host: Host, argv: list[str]) -> str:
    """The output of ``argv`` run on ``host`` as its processes run (asserting it succeeded)."""
    done = subprocess.run(host.command(argv), env=host.env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, f"on {host.name}: {argv}: {done.stdout}{done.stderr}"
    return done.stdout


def probe(host: Host, name: str, keep: list[Path], tried: list[Path]) -> tuple[set[Path], dict[Path, str]]:
    """On ``host``: the mount points it can write and, for each folder of ``keep`` and ``tried``, ``"written"`` (a
    file ``name`` was made there; it stays in those of ``keep``) or why not (``"EROFS"``: a read-only file system)."""
    folders = [json.dumps([str(folder) for folder in folders]) for folders in (keep, tried)]
    seen = json.loads(run_on(host, [sys.executable, "-c", PROBE, name, *folders]))
    return {Path(point) for point in seen["writable"]}, {Path(folder): why for folder, why in seen["writes"].items()}


def forbidden(host: Host, repo: Path) -> list[Path]:
    """Folders ``host`` must not write: the machine's own (root's home, /var/tmp, /etc, /run, /usr), the checkout and
    the venv, the deployment's root, the controller's files, the other hosts' disks and a shared volume not given it;
    /tmp and /dev/shm as well where they are not the host's own. A checkout under /tmp (a fresh clone in CI) is seen
    in the host's own /tmp, where only its code is bound read-only: its top folder is then one of the host's own."""
    root = host.root
    top = [] if host.private_tmp and repo.resolve().is_relative_to("/tmp") else [repo]
    places = [Path("/root"), Path("/var/tmp"), Path("/etc"), Path("/run"), Path("/usr/local"), *top,
              repo / "dags_examples", Path(sys.prefix), root, root / "empty", *host.hidden()]
    if not host.private_tmp:
        places.append(Path("/tmp"))
    return [place for place in places if place.is_dir() and place not in host.writable()]

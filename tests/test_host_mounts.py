"""Each host's view of the files (tests/infra/hosts.py), without a deployment: two hosts made in a second.

The whole machine is read-only on a host except its own places (its disk, ``/tmp``, ``/dev/shm``, its ``etc``) and
the shared volume where given it; what it writes there lands in its own directories, where the other host does not
see it. A checkout under ``/tmp`` (a fresh clone in CI) is still seen by the host, read-only, in its own ``/tmp``.
The tier (tests/test_hosts_deployment.py) checks the same on the five hosts of the deployment with everything
running. Needs root and ``ip netns``; without them it skips and says why.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.hosts import CODE, REPO, Hosts, namespaces_unavailable
from tests.support.host_files import forbidden, probe, run_on


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[tuple[Hosts, Path]]:
    """Hosts ``a`` (given the shared volume) and ``b`` under a root in /var/tmp, with code in ``tmp_path`` (under
    /tmp, as a checkout there would be)."""
    why_not = namespaces_unavailable()
    if why_not:
        pytest.skip(f"hosts need network namespaces: {why_not}")
    code = tmp_path / "checkout"
    code.mkdir()
    (code / "module.py").write_text("CODE = 1\n")
    assert str(code).startswith("/tmp/"), code  # pytest's basetemp: see --basetemp
    root = Path(tempfile.mkdtemp(prefix="airflow-jetstream-mounts-", dir="/var/tmp"))
    hosts = Hosts(root, names=("a", "b"), shared=("a",), code=(*CODE, code))  # the venv runs the probe
    try:
        yield hosts.create(), code
    finally:
        left = hosts.remove()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, left


def test_a_host_writes_only_its_own_places_and_sees_only_its_own_files(two_hosts: tuple[Hosts, Path]) -> None:
    hosts, code = two_hosts
    for name, host in hosts.hosts.items():
        own = list(host.writable())
        writable, writes = probe(host, f"written-by-{name}", own, [*forbidden(host, REPO), code])
        assert writable == set(own), f"{name} can write {writable}, not only {own}"
        assert {folder for folder, why in writes.items() if why == "written"} == set(own), writes
        assert {why for folder, why in writes.items() if folder not in own} == {"EROFS"}, writes
    a, b = hosts["a"], hosts["b"]
    for host, other in ((a, b), (b, a)):
        for seen, source in host.writable().items():
            assert (source / f"written-by-{host.name}").is_file(), f"{host.name} wrote {seen}, not {source}"
            assert not (source / f"written-by-{other.name}").exists(), f"{other.name} wrote into {source}"
    assert (hosts.root / "shared" / "written-by-a").is_file()
    assert not (code / "written-by-a").exists() and not Path("/tmp/written-by-a").exists()
    assert run_on(a, ["cat", str(code / "module.py")]) == "CODE = 1\n"


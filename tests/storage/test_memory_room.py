"""The memory a store may still take sees a container's limit (review 71 F1, F7): the transient
store pool's check compared with the host's available memory (20 GiB here), so in a 512 MiB
container the pool was allocated and the OOM killer took the host process at the open."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.storage.memory import MemoryRoom, cgroup_room

MIB = 1024 * 1024


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v2_group_and_its_parents_give_the_tightest_room(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "app" / "memory.max", f"{1024 * MIB}\n")
    _write(root / "app" / "memory.current", f"{100 * MIB}\n")
    _write(root / "app" / "web" / "memory.max", f"{256 * MIB}\n")
    _write(root / "app" / "web" / "memory.current", f"{100 * MIB}\n")
    _write(root / "app" / "web" / "memory.stat", f"anon 1\ninactive_file {20 * MIB}\n")
    _write(root / "app" / "web" / "svc" / "memory.max", "max\n")
    _write(tmp_path / "proc_cgroup", "0::/app/web/svc\n")
    assert cgroup_room(str(tmp_path / "proc_cgroup"), str(root)) == MemoryRoom(total=256 * MIB, available=176 * MIB)


def test_a_v1_memory_group_counts_and_unlimited_is_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "memory" / "docker" / "c1" / "memory.limit_in_bytes", f"{512 * MIB}\n")
    _write(root / "memory" / "docker" / "c1" / "memory.usage_in_bytes", f"{600 * MIB}\n")
    _write(root / "memory" / "docker" / "c1" / "memory.stat", f"cache 5\ntotal_inactive_file {200 * MIB}\n")
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    # A v1 machine lists the v2 group too, with no v2 hierarchy mounted: not read.
    _write(tmp_path / "proc_cgroup", "12:pids:/docker/c1\n5:memory:/docker/c1\n0::/\n")
    assert cgroup_room(str(tmp_path / "proc_cgroup"), str(root)) == MemoryRoom(total=512 * MIB, available=112 * MIB)
    _write(tmp_path / "unlimited", "5:memory:/\n")
    assert cgroup_room(str(tmp_path / "unlimited"), str(root)) is None


@pytest.fixture
def memory_group() -> Iterator[Path]:
    """A real memory cgroup of 160 MiB (v1 or v2), or a skip with the reason."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists():
        if "memory" not in (v2 / "cgroup.subtree_control").read_text().split():
            pytest.skip("the cgroup v2 root does not delegate the memory controller")
        group, limit_file = v2 / f"mqstore-test-{os.getpid()}", "memory.max"
    elif (v2 / "memory" / "memory.limit_in_bytes").exists():
        group, limit_file = v2 / "memory" / f"mqstore-test-{os.getpid()}", "memory.limit_in_bytes"
    else:
        pytest.skip("no cgroup memory controller here")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup: {exc}")
    try:
        (group / limit_file).write_text(str(160 * MIB))
        yield group
    finally:
        group.rmdir()


def test_a_transient_pool_larger_than_the_containers_memory_is_refused_not_killed(
    tmp_path: Path, memory_group: Path
) -> None:
    child = textwrap.dedent(f"""
        import os, sys
        with open({str(memory_group / "cgroup.procs")!r}, "w") as f:
            f.write(str(os.getpid()))
        import mqstore
        from mqstore.config import ConfigError
        try:
            mqstore.open({str(tmp_path / "s")!r}, transient_store_pool_enable=True, transient_store_pool_size=2,
                         mapped_file_size_commitlog_bytes={128 * MIB}).close()
        except ConfigError as exc:
            print("refused:", exc)
            sys.exit(0)
        print("opened")
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])  # -9: the OOM killer
    assert "refused:" in done.stdout and "cgroup limit" in done.stdout, done.stdout


def test_a_transient_pool_a_data_limit_refuses_is_a_config_error_not_a_bare_memory_error(tmp_path: Path) -> None:
    """Review 71 F6: under RLIMIT_DATA the pool's allocation raised a bare MemoryError() from
    the open; it is the documented ConfigError naming the setting now."""
    child = textwrap.dedent(f"""
        import resource
        import mqstore
        from mqstore.config import ConfigError
        resource.setrlimit(resource.RLIMIT_DATA, ({512 * MIB}, {512 * MIB}))
        try:
            mqstore.open({str(tmp_path / "s")!r}, transient_store_pool_enable=True, transient_store_pool_size=4,
                         mapped_file_size_commitlog_bytes={256 * MIB}).close()
        except ConfigError as exc:
            print("refused:", exc)
        else:
            print("opened")
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "refused: config transient_store_pool_size" in done.stdout, (done.stdout, done.stderr[-2000:])
    assert "could not be allocated" in done.stdout


def test_a_group_name_that_is_not_utf8_is_read_not_raised(tmp_path: Path) -> None:
    """Review 72 M4: /proc/self/cgroup was decoded as UTF-8, and a group named with other
    bytes raised UnicodeDecodeError at `import mqstore` (reads asks for the room at import)."""
    root = tmp_path / "cgroup"
    name = b"svc_\xff"
    group = Path(os.fsdecode(bytes(root / "memory") + b"/" + name))
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(f"{64 * MIB}\n")
    (group / "memory.usage_in_bytes").write_text(f"{16 * MIB}\n")
    (tmp_path / "proc_cgroup").write_bytes(b"5:memory:/" + name + b"\n")
    assert cgroup_room(str(tmp_path / "proc_cgroup"), str(root)) == MemoryRoom(total=64 * MIB, available=48 * MIB)

"""A host whose descriptors 0, 1 or 2 are closed (a daemon, `cmd <&- >&- 2>&-`): the store never
opens its files there. Whatever writes to "stderr" by number (a C library, a fatal error, a
child given the host's stdio) would write into that store file (review 94 M2: the lock file,
an index file on fd 2). Files land above 2, and a slot a store file would have taken holds
/dev/null (as SQLite does)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import mqstore
from mqstore.storage import fs

HOST_WITHOUT_STDIO = """
import json, os, sys
root, report = sys.argv[1], sys.argv[2]
import mqstore
from mqstore import Message
for fd in (0, 1, 2):
    os.close(fd)
landed = {}
def where_stdio_points():
    for fd in (0, 1, 2):
        try:
            landed.setdefault(os.readlink(f"/proc/self/fd/{fd}"), fd)
        except OSError:
            pass
store = mqstore.open(root, mapped_file_size_commitlog_bytes=64 << 10, max_hash_slot_num=64, max_index_num=256)
for i in range(300):
    assert store.put(Message("t", b"%04d" % i * 100, keys=[f"k{i}"])).ok
    where_stdio_points()
    for fd in (0, 1, 2):  # what a C library or a fatal error writes "to stderr"
        try:
            os.write(fd, b"STRAY")
        except OSError:
            pass
where_stdio_points()
closed = store.close()
with open(report, "w") as f:
    json.dump({"closed": closed, "landed": landed}, f)
"""


def test_a_host_without_stdio_gets_no_store_file_on_descriptors_0_to_2(tmp_path: Path) -> None:
    root, report = tmp_path / "store", tmp_path / "report.json"
    subprocess.run([sys.executable, "-c", HOST_WITHOUT_STDIO, str(root), str(report)], timeout=120, check=True)
    result = json.loads(report.read_text())
    assert result["closed"] is True
    store_files = {path: fd for path, fd in result["landed"].items() if path.startswith(str(root))}
    assert store_files == {}, f"store files on the host's stdio descriptors: {store_files}"
    for path in root.rglob("*"):
        if path.is_file():
            assert b"STRAY" not in path.read_bytes(), f"a write to the host's stdio went into {path}"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=64 << 10, max_hash_slot_num=64, max_index_num=256) as store:
        bodies: list[bytes] = []
        while len(bodies) < 300 and (got := store.get("t", 0, len(bodies), 32).messages):
            bodies += [m.body for m in got]
        assert bodies == [b"%04d" % i * 100 for i in range(300)]
        assert [m.body for m in store.query("t", "k299").messages] == [b"0299" * 100]


MOVED_ABOVE_STDIO = """
import os, sys
from mqstore.storage import fs
os.close(2)
fd = fs.open_fd(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
print(fd, os.readlink("/proc/self/fd/2"), os.get_inheritable(fd), os.get_inheritable(2))
"""


def test_open_fd_moves_a_file_above_stdio_and_fills_the_slot_with_dev_null(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", MOVED_ABOVE_STDIO, str(tmp_path / "f")],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    fd, slot, inheritable, slot_inheritable = out.stdout.split()
    assert int(fd) > 2 and slot == os.devnull
    assert inheritable == "False"  # O_CLOEXEC kept
    assert slot_inheritable == "True"  # a stdio slot, as the host's own would be


def test_open_fd_is_os_open_when_stdio_is_there(tmp_path: Path) -> None:
    fd = fs.open_fd(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        assert fd > 2 and not os.get_inheritable(fd)
        assert os.fstat(fd).st_mode & 0o777 == 0o600
    finally:
        os.close(fd)


EVERY_FILL_INHERITABLE = """
import os, subprocess, sys
from mqstore.storage import fs
os.close(1)
os.close(2)
fd = fs.open_fd(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # lands on 1; /dev/null takes 2 too
filled = [(os.readlink(f"/proc/self/fd/{n}"), os.get_inheritable(n)) for n in (1, 2)]
child = subprocess.run([sys.executable, "-c", "import os; print(os.readlink('/proc/self/fd/1'))"],
                       stdout=None, stderr=subprocess.DEVNULL, close_fds=True)  # the host's stdio
with open(sys.argv[2], "w") as report:
    report.write(repr((fd > 2, filled, child.returncode)))
"""


def test_every_dev_null_fill_is_inheritable_so_a_child_gets_its_stdio(tmp_path: Path) -> None:
    """Review 95 M2: the /dev/null kept where it landed (another closed slot) was not
    inheritable: a child given the host's stdio started with fd 1 closed, and its own first
    file there took what it printed."""
    report = tmp_path / "report"
    subprocess.run([sys.executable, "-c", EVERY_FILL_INHERITABLE, str(tmp_path / "f"), str(report)], timeout=60, check=True)
    moved, filled, child_code = ast.literal_eval(report.read_text())
    assert moved and filled == [(os.devnull, True), (os.devnull, True)] and child_code == 0


def test_the_cli_start_fills_closed_stdio_inheritably(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import os; os.close(1); from mqstore.storage import fs; fs.fill_stdio_with_dev_null(); "
         "os.write(2, repr((os.readlink('/proc/self/fd/1'), os.get_inheritable(1))).encode())"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert out.stderr == repr((os.devnull, True))

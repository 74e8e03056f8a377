"""Issue 14: the read-only commands (dump, get, query, inspect, stats, verify) never create, write,
truncate, recover or delete anything, on a clean store and on one killed with kill -9."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import mqstore
from mqstore.cli import ExitCode, main

PRODUCER = Path(__file__).resolve().parents[1] / "crash" / "producer.py"
MiB = 1 << 20
# Small index files: each snapshot hashes every byte of the store (a default index is 420 MB).
SMALL_INDEX = dict(max_hash_slot_num=100, max_index_num=400)

Snapshot = dict[str, tuple[str, int, str]]


def snapshot(root: Path) -> Snapshot:
    """Every file and directory under `root`: kind, mtime (ns) and, for files, size and hash."""
    out: Snapshot = {".": ("dir", root.stat().st_mtime_ns, "")}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if path.is_dir():
                out[rel] = ("dir", st.st_mtime_ns, "")
            elif not path.is_file():  # a FIFO: reading it would block
                out[rel] = ("other", st.st_mtime_ns, "")
            else:
                out[rel] = ("file", st.st_mtime_ns, f"{st.st_size}:{hashlib.sha256(path.read_bytes()).hexdigest()}")
    return out


def commands(root: Path, key: str) -> list[list[str]]:
    r = str(root)
    return [
        ["dump", r],
        ["dump", r, "--what", "consumequeue"],
        ["dump", r, "--what", "index"],
        ["dump", r, "--what", "checkpoint"],
        ["get", r, "--topic", "crash", "--queue", "0", "--offset", "0", "--max", "64"],
        ["get", r, "--topic", "crash", "--queue", "1", "--offset", "0", "--tags", "A||B"],
        ["query", r, "--topic", "crash", "--key", key],
        ["inspect", r],
        ["inspect", r, "--json"],
        ["stats", r],
        ["verify", r],
    ]


@pytest.fixture(scope="module")
def crashed_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store left by kill -9 of a producer mid-put (SYNC_FLUSH, 64 KiB segments)."""
    root = tmp_path_factory.mktemp("crashed") / "store"
    proc = subprocess.Popen([sys.executable, str(PRODUCER), str(root), "7", "3"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    key = ""
    acked = 0
    for line in proc.stdout:
        if line.startswith("OK "):
            acked += 1
            key = key or line.split()[1]
            if acked >= 600:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert acked >= 600 and (root / "abort").exists()
    return root, key


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("clean") / "store"
    # Small index files: each command's snapshot hashes every file (a default one is ~420 MB).
    # RocketMQ's 4:1 entries to slots, so `dump --what index` finds the geometry by itself.
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, allocate_wait_timeout_ms=200,
                      max_hash_slot_num=100, max_index_num=400) as store:  # fmt: skip
        for i in range(300):
            msg = mqstore.Message(topic="crash", body=b"x" * 50, tags="AB"[i % 2], keys=[f"k-{i}"], queue_id=i % 4)
            assert store.put(msg).ok
    return root, "k-5"


def test_read_only_commands_change_nothing_on_a_clean_store(
    clean_store: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    shutil.copytree(clean_store[0], root)
    before = snapshot(root)
    for argv in commands(root, clean_store[1]):
        code = main(argv)
        out = capsys.readouterr()
        assert code == 0, (argv, out.err)
        assert snapshot(root) == before, argv


def test_read_only_commands_change_nothing_on_a_crashed_store_and_name_recover(
    crashed_store: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    shutil.copytree(crashed_store[0], root)
    before = snapshot(root)
    found_key = False
    for argv in commands(root, crashed_store[1]):
        code = main(argv)
        out = capsys.readouterr()
        assert code in (0, 3), (argv, code, out.err)  # 3: corrupt data reported, valid data still read
        assert snapshot(root) == before, argv
        assert f"mqstore recover {root}" in out.err, (argv, out.err)
        if argv[0] == "query":
            found_key = crashed_store[1] in out.out
    assert found_key  # an acknowledged message is read from the crashed store as it is


# Where the review's sweep of every store file found a read-only command hanging.
FIFO_PLACES = {
    "stats_snapshot": "stats.msgpack",
    "first_segment": "commitlog/" + "0" * 20,
    "later_segment": "commitlog/" + "%020d" % 65536,
}


@pytest.mark.parametrize("place", sorted(FIFO_PLACES))
def test_read_only_commands_answer_on_a_fifo_among_the_store_files_and_change_nothing(tmp_path: Path, place: str) -> None:
    """A FIFO where the store keeps a file: `mqstore stats` and `verify` hung for good opening
    it (a review's sweep: the snapshot reader and the read-only segment maps opened in blocking
    mode). Each read-only command now answers, whatever it says, and changes no byte."""
    import threading

    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=65536, mapped_file_size_consume_queue_bytes=20 * 100, **SMALL_INDEX) as store:
        for i in range(150):
            assert store.put(mqstore.Message(topic="t", body=b"x" * 600, keys=[f"k{i}"])).ok
        assert store.wait_for_messages("t", 0, 149, timeout_s=10)
    (root / "stats.msgpack").write_bytes(b"")
    fifo = root / FIFO_PLACES[place]
    fifo.unlink()
    os.mkfifo(fifo)
    before = snapshot(root)
    for argv in (["dump", str(root)], ["dump", str(root), "--what", "checkpoint"], ["inspect", str(root)],
                 ["stats", str(root)], ["verify", str(root)]):  # fmt: skip
        codes: list[int] = []
        runner = threading.Thread(target=lambda: codes.append(main(argv)), daemon=True)
        runner.start()
        runner.join(30)
        assert codes, f"mqstore {argv[0]} hung on a FIFO at {FIFO_PLACES[place]}"
    assert snapshot(root) == before


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
def test_dump_checkpoint_says_what_is_there_instead_of_the_checkpoint(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO or a directory where the checkpoint belongs was reported as "does not exist"."""
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=65536, mapped_file_size_consume_queue_bytes=20 * 100, **SMALL_INDEX) as store:
        assert store.put(mqstore.Message(topic="t", body=b"x")).ok
    checkpoint = root / "checkpoint"
    checkpoint.unlink()
    if kind == "fifo":
        os.mkfifo(checkpoint)
    elif kind == "directory":
        checkpoint.mkdir()
    before = snapshot(root)
    code = main(["dump", str(root), "--what", "checkpoint"])
    err = capsys.readouterr().err
    assert code != 0
    if kind == "missing":
        assert "does not exist" in err
    else:
        assert "is not a regular file" in err and "does not exist" not in err
    assert snapshot(root) == before


@pytest.mark.parametrize("kind", ["fifo", "directory", "empty"])
def test_read_only_commands_name_a_first_segment_that_is_not_one(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 26: with the first segment a FIFO, a directory or emptied, `inspect` failed with
    `ValueError: max() arg is an empty sequence` or `cannot mmap an empty file` (exit 1), and
    so did `verify` on an empty one; `dump` blamed the wrong file at a negative position, or
    printed nothing and exited 0 (the segment size was read off the emptied file). The segment
    size is the segments' own now, and each command names the file: exit 3 (damaged) or 5."""
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=65536, **SMALL_INDEX) as store:
        for i in range(200):
            assert store.put(mqstore.Message(topic="t", body=b"x" * 600, keys=[f"k{i}"])).ok
    first = root / "commitlog" / ("0" * 20)
    first.unlink()
    {"fifo": os.mkfifo, "directory": os.mkdir, "empty": lambda p: open(p, "wb").close()}[kind](first)
    before = snapshot(root)
    for argv in (["inspect", str(root)], ["verify", str(root)], ["dump", str(root)]):
        code = main(argv)
        err = capsys.readouterr().err
        assert code in (ExitCode.CORRUPT, ExitCode.NOT_A_STORE), (argv, code, err)
        assert str(first) in err or "offset 0: file is 0 bytes" in err, (argv, err)
        assert "Error:" not in err and "position -" not in err, (argv, err)
    assert snapshot(root) == before


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling"])
def test_read_only_commands_name_what_stands_where_a_consume_queue_file_belongs(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review 26: a bare `IsADirectoryError`, `NotARegularFileError` or `FileNotFoundError` and
    exit 1 (`inspect`: "healthy", the queue with 0 files); now each names the file, exit 5 as
    from an open (or 3 from `inspect`: damage found)."""
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=65536, **SMALL_INDEX) as store:
        for i in range(20):
            assert store.put(mqstore.Message(topic="t", body=b"x", keys=[f"k{i}"])).ok
    unit_file = root / "consumequeue" / "t" / "0" / ("0" * 20)
    unit_file.unlink()
    {"fifo": os.mkfifo, "directory": os.mkdir, "dangling": lambda p: p.symlink_to(tmp_path / "gone")}[kind](unit_file)
    before = snapshot(root)
    for argv in (["get", str(root), "--topic", "t", "--queue", "0", "--offset", "0"], ["inspect", str(root)],
                 ["verify", str(root)]):  # fmt: skip
        code = main(argv)
        out, err = capsys.readouterr()
        expected = (ExitCode.CORRUPT, ExitCode.NOT_A_STORE) if argv[0] == "inspect" else (ExitCode.NOT_A_STORE,)
        assert code in expected and f"{unit_file} is " in out + err, (argv, code, out, err)
        assert "Error:" not in err, (argv, err)
    assert snapshot(root) == before


def test_read_only_answers_say_when_the_stores_own_records_show_files_missing(
    clean_store: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review 45 F6: with index/ gone, `query` answered no message and `verify`/`inspect` said
    healthy; with a queue's files gone, `get` said NO_MESSAGE_IN_QUEUE, all with exit 0,
    though the index progress and the queue ledger said the files had been there. Now the
    answer says so (a `detail`, exit 3); nothing is written."""
    import json

    root = tmp_path / "store"
    shutil.copytree(clean_store[0], root)
    shutil.rmtree(root / "index")
    shutil.rmtree(root / "consumequeue" / "crash" / "1")
    before = snapshot(root)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = run("query", str(root), "--topic", "crash", "--key", clean_store[1])
    assert code == ExitCode.CORRUPT and out == "" and "is gone (the index progress lists it)" in json.loads(err)["detail"]
    code, out, err = run("get", str(root), "--topic", "crash", "--queue", "1", "--offset", "0")
    summary = json.loads(err.splitlines()[-1])
    assert code == ExitCode.CORRUPT and summary["status"] == "NO_MESSAGE_IN_QUEUE"
    assert "ConsumeQueue files are missing or cut" in summary["detail"]
    code, out, err = run("get", str(root), "--topic", "crash", "--queue", "0", "--offset", "0", "--max", "8")
    assert code == ExitCode.OK and len(out.splitlines()) == 8 and "detail" not in json.loads(err.splitlines()[-1])
    code, out, err = run("verify", str(root))
    assert code != ExitCode.OK and "index_file_lost" in out + err
    code, out, err = run("inspect", str(root), "--json")
    report = json.loads(out)
    assert report["verdict"] == "needs recovery" and "index_file_lost" in {p["kind"] for p in report["problems"]}
    assert snapshot(root) == before
    with mqstore.open(root, max_hash_slot_num=100, max_index_num=400) as store:  # the open rebuilds both
        assert [m.keys for m in store.query("crash", clean_store[1], 4).messages] == [clean_store[1]]
        assert store.max_offset("crash", 1) == 75 and len(store.get("crash", 1, 0, 32).messages) == 32

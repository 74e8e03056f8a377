"""Review 65 F1 and F6: files the command's user may not read, and a store another user runs.

F1: `get` and `query` skipped a commitlog segment they could not open (EACCES) as if it held
no valid record: FOUND past it, "0 messages", exit 0. `dump`, `verify` and `inspect` called it
damage and pointed at `mqstore recover`. Now each says the file cannot be read now, naming it
and the errno, skips nothing, and exits 1.

F6: `recover` and `clean` on a store open in another user's process failed with a bare
"PermissionError: …/lock"; they now say the store is running (exit 4), as `verify` does.

Permission bits do not stop root: run as root, a command runs in a forked child that drops to
uid/gid 65534 (nobody) first, without an exec (the interpreter may live where nobody cannot
reach it), on a store under a directory made traversable. An I/O error (EIO) is injected
through the file system's map call, which every run can do.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.cli import ExitCode, main
from mqstore.storage import fs as storage_fs
from mqstore.tools import clean_cli, inspect_cli, read_cli, recovery_cli, verify  # noqa: F401 (loaded before a fork)

NOBODY = 65534
SEGMENT = 64 * 1024
SMALL_STORE = {
    "mapped_file_size_commitlog_bytes": SEGMENT,
    "mapped_file_size_consume_queue_bytes": 20 * 100,
    "max_hash_slot_num": 1000,
    "max_index_num": 4000,
}
MESSAGES = 300  # about 215 records a segment: two segments

# A child's exit codes that mean "this run cannot drop privileges here" (skip, with the reason).
_CANNOT_DROP, _CANNOT_REACH, _CANNOT_IMPORT = 97, 96, 98


@pytest.fixture(scope="module")
def base_store() -> Iterator[Path]:
    """A closed store of two segments, under a directory any user may traverse."""
    top = Path(tempfile.mkdtemp(prefix="mqstore-review65-"))
    try:
        top.chmod(0o755)
        root = top / "base"
        with mqstore.open(root, **SMALL_STORE) as store:
            for i in range(MESSAGES):
                msg = mqstore.Message(topic="T", body=f"BODY-{i:06d}-".encode() + b"p" * 250, keys=[f"k{i}"], queue_id=0)
                assert store.put(msg).ok
        segments = sorted((root / "commitlog").iterdir())
        assert [p.name for p in segments][:2] == [f"{0:020d}", f"{SEGMENT:020d}"]
        yield root
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def store(base_store: Path) -> Iterator[Path]:
    root = base_store.parent / f"s{time.monotonic_ns()}"
    shutil.copytree(base_store, root)
    try:
        yield root
    finally:
        for path in (root / "commitlog").iterdir():
            path.chmod(0o644)
        shutil.rmtree(root, ignore_errors=True)


def segment(root: Path, k: int) -> Path:
    return root / "commitlog" / f"{k * SEGMENT:020d}"


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_file():
            with open(path, "rb") as f:  # (as root, or before the mode is taken away)
                out[str(path)] = f"{st.st_mtime_ns}:{st.st_mode:o}:{hashlib.sha256(f.read()).hexdigest()}"
        else:
            out[str(path)] = f"{st.st_mtime_ns}:{st.st_mode:o}"
    return out


def deny(path: Path) -> None:
    """Make `path` unreadable to the user `run_denied` runs a command as."""
    # As root: root-owned 0600, as a root process with umask 077 leaves it; the command runs as nobody.
    path.chmod(0o600 if os.geteuid() == 0 else 0)


def run_denied(argv: list[str]) -> tuple[int, str, str]:
    """Run `mqstore argv` as a user file modes apply to: nobody in a forked child when this
    process is root, else this user. (exit code, stdout, stderr)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
                sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
                code = _child(argv)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        code = _wait(pid, 120.0)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if code == _CANNOT_DROP:
        pytest.skip(f"cannot drop to uid {NOBODY} here: {stderr.strip()}")
    if code == _CANNOT_REACH:
        pytest.skip(f"uid {NOBODY} cannot reach the store or the code: {stderr.strip()}")
    if code == _CANNOT_IMPORT:
        pytest.skip(f"uid {NOBODY} cannot import what the command needs (the interpreter's files): {stderr.strip()}")
    return code, stdout, stderr


def _child(argv: list[str]) -> int:
    if os.geteuid() == 0:
        for name in ("ascii", "latin-1", "utf-8"):  # (lock_state reads /proc/locks as ascii)
            codecs.lookup(name)  # loaded now: nobody may not reach the interpreter's files
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        except OSError as exc:
            print(exc, file=sys.stderr)
            return _CANNOT_DROP
        for needed in (argv[1], os.path.dirname(mqstore.__file__)):
            if not os.access(needed, os.R_OK | os.X_OK):
                print(f"{needed} is not readable and searchable by uid {NOBODY}", file=sys.stderr)
                return _CANNOT_REACH
    try:
        return main(argv)
    except ImportError as exc:  # (main reports other errors itself)
        print(exc, file=sys.stderr)
        return _CANNOT_IMPORT


def _wait(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the command did not end within {timeout_s} s")


def summary_of(stderr: str) -> dict[str, Any]:
    lines = [line for line in stderr.splitlines() if line.startswith("{")]
    assert lines, stderr
    return json.loads(lines[-1])


def get_argv(root: Path, offset: int, count: int = 3) -> list[str]:
    return ["get", str(root), "--topic", "T", "--queue", "0", "--offset", str(offset), "--max", str(count)]


def first_queue_offset_in(root: Path, k: int) -> int:
    """The queue offset of the first message stored in segment k (read as root, or before denying)."""
    units = list(read_cli.iter_cq_units(str(root / "consumequeue" / "T" / "0"), storage_fs.RealFileSystem()))
    return min(q for q, phy, _, _ in units if phy >= k * SEGMENT)


# ---------------------------------------------------------------------------------------------
# F1: a segment the user may not read


def test_get_says_a_segment_it_may_not_read_is_not_readable_now_and_skips_nothing(store: Path) -> None:
    in_second = first_queue_offset_in(store, 1)
    before = snapshot(store)
    deny(segment(store, 0))
    code, out, err = run_denied(get_argv(store, 0))
    summary = summary_of(err)
    # Before: FOUND with queue offsets 215.. (the first in segment 1), next_begin_offset 218, exit 0.
    assert code == ExitCode.FAILURE, err
    assert out == "" and summary["status"] == "NO_MATCHED_LOGIC_QUEUE" and summary["next_begin_offset"] == 0, err
    assert str(segment(store, 0)) in summary["detail"] and "EACCES" in summary["detail"], summary
    assert "nothing was skipped" in summary["detail"] and "recover" not in summary["detail"], summary
    # The readable segment's messages are still served.
    code, out, err = run_denied(get_argv(store, in_second))
    assert code == ExitCode.OK and summary_of(err)["status"] == "FOUND" and len(out.splitlines()) == 3, err
    segment(store, 0).chmod(0o644)
    assert snapshot(store) == before


def test_get_serves_what_it_read_and_stops_at_a_later_segment_it_may_not_read(store: Path) -> None:
    in_second = first_queue_offset_in(store, 1)
    deny(segment(store, 1))
    code, out, err = run_denied(get_argv(store, in_second - 2, 32))
    summary = summary_of(err)
    assert code == ExitCode.FAILURE, err
    assert [json.loads(line)["queue_offset"] for line in out.splitlines()] == [in_second - 2, in_second - 1]
    assert summary["status"] == "FOUND" and summary["next_begin_offset"] == in_second, summary
    assert str(segment(store, 1)) in summary["detail"], summary


@pytest.mark.parametrize("name", ["checkpoint", "queue_ledger.msgpack", f"consumequeue/T/0/{0:020d}"])
def test_verify_calls_a_store_file_it_may_not_read_unreadable_not_corrupt(store: Path, name: str) -> None:
    """Review 119 F2: an unreadable checkpoint or queue ledger (a permission) was a problem
    like any other: exit 3, which sends the operator to `recover`, which would not fix it; a
    consume queue file gave a bare PermissionError and no report (review 122 F6)."""
    before = snapshot(store)
    deny(store / name)
    code, out, err = run_denied(["verify", str(store), "--json"])
    report = json.loads(out)
    kinds = [p["kind"] for p in report["problems"]]
    assert code == ExitCode.FAILURE and len(kinds) == 1 and kinds[0].endswith("_unreadable"), (kinds, err)
    assert report["unreadable_files"] == 1 and "make them readable" in err and "recover" not in err, err
    (store / name).chmod(0o644)
    assert snapshot(store) == before


def test_an_index_file_it_may_not_read_blocks_no_command_that_needs_no_index(store: Path) -> None:
    """Review 119 F3: the geometry's detection read every index file's header (through a map
    of the whole file): one the user may not read made get, dump, stats, inspect and verify
    exit 1 with a bare PermissionError. Get and dump need no index; verify names the file."""
    index = sorted((store / "index").iterdir())[0]
    deny(index)
    code, out, err = run_denied(get_argv(store, 0))
    assert code == ExitCode.OK and len(out.splitlines()) == 3, err
    code, out, err = run_denied(["dump", str(store)])
    assert code == ExitCode.OK and len(out.splitlines()) >= MESSAGES, err[-2000:]
    code, out, err = run_denied(["verify", str(store), "--json"])
    report = json.loads(out)
    assert code == ExitCode.FAILURE and [p["kind"] for p in report["problems"]] == ["index_unreadable"], (out, err)
    assert report["unreadable_files"] == 1
    # Review 122 F5: inspect called it damaged and query corrupt (exit 3), which `recover` does not fix.
    code, out, err = run_denied(["inspect", str(store), "--json"])
    report = json.loads(out)
    assert code == ExitCode.FAILURE and report["verdict"] == "unreadable", (report["problems"], err)
    assert [(p["kind"], p.get("errno")) for p in report["problems"]] == [("index_unreadable", "EACCES")], report["problems"]
    code, out, err = run_denied(["query", str(store), "--topic", "T", "--key", "k5"])
    assert code == ExitCode.FAILURE and "EACCES" in err and "recover" not in err, err
    index.chmod(0o644)


def test_query_says_a_segment_it_may_not_read_is_not_readable_now(store: Path) -> None:
    deny(segment(store, 0))
    code, out, err = run_denied(["query", str(store), "--topic", "T", "--key", "k5"])
    summary = summary_of(err)
    # Before: {"messages": 0, ...}, exit 0 (as root the message is found at offset 1505).
    assert code == ExitCode.FAILURE and summary["messages"] == 0, err
    assert str(segment(store, 0)) in summary["detail"] and "EACCES" in summary["detail"], summary
    # A key whose message the user may read is found as before.
    key = f"k{first_queue_offset_in(store, 1) + 1}"
    code, out, err = run_denied(["query", str(store), "--topic", "T", "--key", key])
    assert code == ExitCode.OK and len(out.splitlines()) == 1, err


def test_dump_verify_and_inspect_call_a_segment_they_may_not_read_unreadable_not_damaged(store: Path) -> None:
    before = snapshot(store)
    deny(segment(store, 0))
    code, out, err = run_denied(["dump", str(store)])
    assert code == ExitCode.FAILURE and out == "", err
    assert f"{segment(store, 0)} cannot be read now (EACCES" in err and "corrupt" not in err and "recover" not in err, err

    code, out, err = run_denied(["verify", str(store), "--json"])
    report = json.loads(out)
    kinds = [p["kind"] for p in report["problems"]]
    # Before: commitlog_damaged "… quarantined, not cut", which `recover` is the answer to.
    assert code == ExitCode.FAILURE and kinds == ["commitlog_unreadable"], (kinds, err)
    assert "EACCES" in report["problems"][0]["detail"] and report["unreadable_segments"] == 1
    assert report["problems"][0]["where"] == str(segment(store, 0))

    code, out, err = run_denied(["inspect", str(store), "--json"])
    report = json.loads(out)
    assert code == ExitCode.FAILURE and report["verdict"] == "unreadable", (report["problems"], err)
    assert [(p["kind"], p["severity"]) for p in report["problems"]] == [("segment_unreadable", "unreadable")]
    assert report["problems"][0]["errno"] == "EACCES" and report["commitlog"]["segments"][0]["end"] == "unreadable"
    assert "mqstore inspect: unreadable:" in err and "not known to be damaged" in err and "recover" not in err, err
    segment(store, 0).chmod(0o644)
    assert snapshot(store) == before


def test_a_last_segment_it_may_not_read_is_not_a_log_cut_short(store: Path) -> None:
    """The active segment unreadable: the units into it are not "past the log's end" and the
    flushed offset is not "above the records" (the records' end there is not known)."""
    deny(segment(store, 1))
    code, out, err = run_denied(["inspect", str(store), "--json"])
    report = json.loads(out)
    assert code == ExitCode.FAILURE and report["verdict"] == "unreadable", err
    assert [p["kind"] for p in report["problems"] if p["severity"] != "warning"] == ["segment_unreadable"], report["problems"]
    code, out, err = run_denied(["verify", str(store), "--json"])
    assert code == ExitCode.FAILURE and [p["kind"] for p in json.loads(out)["problems"]] == ["commitlog_unreadable"], out


@pytest.fixture
def eio_on_first_segment(store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Mapping segment 0 fails with EIO (a disk's read error), as any user."""
    real = storage_fs.RealFileSystem.map_file
    broken = str(segment(store, 0))

    def map_file(self: storage_fs.RealFileSystem, path: str, size: int, **kwargs: Any) -> Any:
        if os.path.abspath(path) == broken:
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real(self, path, size, **kwargs)

    monkeypatch.setattr(storage_fs.RealFileSystem, "map_file", map_file)
    return store


def run_here(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", ["get", "query", "dump", "verify", "inspect"])
def test_an_io_error_reading_a_segment_is_not_damage_nor_no_message(eio_on_first_segment: Path, command: str) -> None:
    root = eio_on_first_segment
    argv: dict[str, list[str]] = {
        "get": get_argv(root, 0),
        "query": ["query", str(root), "--topic", "T", "--key", "k5"],
        "dump": ["dump", str(root)],
        "verify": ["verify", str(root)],
        "inspect": ["inspect", str(root)],
    }
    code, out, err = run_here(argv[command])
    text = out + err
    assert code == ExitCode.FAILURE, (code, text)
    assert "cannot be read now (EIO" in text and str(segment(root, 0)) in text and "check the device" in text, text
    assert "corrupt" not in text and "commitlog_damaged" not in text and "FOUND" not in text, text
    assert "recover" not in text, text


def test_real_damage_is_still_damage(store: Path) -> None:
    """A segment cut short is damage as before (verify exit 3, inspect damaged), not "unreadable"."""
    with open(segment(store, 0), "r+b") as f:
        f.truncate(SEGMENT // 2)
    code, out, err = run_here(["verify", str(store)])
    assert code == ExitCode.CORRUPT and "commitlog_damaged" in out and "cannot be read now" not in out + err, out + err
    code, out, err = run_here(["inspect", str(store), "--json"])
    report = json.loads(out)
    assert code == ExitCode.CORRUPT and report["verdict"] == "damaged", err
    assert "segment_unreadable" not in [p["kind"] for p in report["problems"]]


# ---------------------------------------------------------------------------------------------
# F6: recover and clean on a store another user runs


@pytest.mark.parametrize("command", [["recover", "--no-progress"], ["clean", "--now"]])
def test_recover_and_clean_say_a_store_another_user_runs_is_running(store: Path, command: list[str]) -> None:
    shutil.rmtree(store)
    running = mqstore.open(store, **SMALL_STORE)
    try:
        assert running.put(mqstore.Message(topic="T", body=b"x")).ok
        if os.geteuid() != 0:
            (store / "lock").chmod(0o444)  # (this user may not open it to write either)
        code, out, err = run_denied([command[0], str(store), *command[1:]])
        # Before: "PermissionError: [Errno 13] Permission denied: '…/lock'", exit 1.
        assert code == ExitCode.LOCKED and "the store is running" in err and "PermissionError" not in err, (code, err)
    finally:
        assert running.close()


def test_stats_says_a_segment_it_may_not_read_is_not_readable_now(store: Path) -> None:
    """Review 66 F5: `stats` printed a bare PermissionError, unlike the other read tools."""
    deny(segment(store, 1))
    before = snapshot(store)
    code, _out, err = run_denied(["stats", str(store)])
    assert code == ExitCode.FAILURE and "cannot be read now" in err and "not known to be damaged" in err, err
    assert "PermissionError" not in err, err
    assert snapshot(store) == before


def test_damage_skipped_before_a_segment_it_may_not_read_is_still_said(store: Path) -> None:
    """Review 100 M4: a record skipped as damage before a later segment the user may not read
    was dropped from the detail, which said "nothing was skipped"."""
    in_second = first_queue_offset_in(store, 1)
    with open(segment(store, 0), "r+b") as f:
        data = f.read()
    at = data.index(b"T", 88)  # (the first record's topic follows its body: flip its body's last byte)
    with open(segment(store, 0), "r+b") as f:
        f.seek(at - 2)
        byte = f.read(1)
        f.seek(at - 2)
        f.write(bytes([byte[0] ^ 0x01]))
    deny(segment(store, 1))
    code, out, err = run_denied(get_argv(store, 0, in_second + 5))
    detail = summary_of(err)["detail"]
    assert code == ExitCode.FAILURE and str(segment(store, 1)) in detail, err
    assert "queue offset 0: commitlog offset 0" in detail and "nothing was skipped" not in detail, detail


# What each read-only command needs of each file: exit 1 naming the file where it needs it (its
# answer or verdict would be wrong without it), exit 0 where it does not.
_NEEDED_BY = {
    "checkpoint": {"inspect", "verify", "stats", "dump-checkpoint"},
    "queue_ledger.msgpack": {"verify", "get"},
    "index_progress.msgpack": {"inspect", "verify", "query"},
    f"consumequeue/T/0/{0:020d}": {"inspect", "verify", "stats", "dump-consumequeue", "get"},
    "config/consumerOffset.json": {"inspect"},  # (it exited 5, "not a store")
}
_READ_COMMANDS = {
    "inspect": ["inspect", "{root}"],
    "verify": ["verify", "{root}"],
    "stats": ["stats", "{root}"],
    "dump-commitlog": ["dump", "{root}"],
    "dump-consumequeue": ["dump", "{root}", "--what", "consumequeue"],
    "dump-checkpoint": ["dump", "{root}", "--what", "checkpoint"],
    "get": ["get", "{root}", "--topic", "T", "--queue", "0", "--offset", "0", "--max", "3"],
    "query": ["query", "{root}", "--topic", "T", "--key", "k5"],
}


@pytest.mark.parametrize("name", sorted(_NEEDED_BY))
def test_every_read_command_names_a_file_it_needs_and_may_not_read(store: Path, name: str) -> None:
    """Review 122 F6: inspect, dump and get said a bare "PermissionError: [Errno 13] ..." of an
    unreadable checkpoint or ConsumeQueue file; get, query, inspect and verify took an
    unreadable queue ledger or index progress for none (exit 0: a lost ConsumeQueue or index
    file went unsaid)."""
    if name == "config/consumerOffset.json":
        with mqstore.open(store, **SMALL_STORE) as s:
            s.commit_offset("G", "T", 0, 5)
    before = snapshot(store)
    deny(store / name)
    for command, argv in _READ_COMMANDS.items():
        code, out, err = run_denied([a.format(root=store) for a in argv])
        said = f"{command}: exit {code}\n{err[-1500:]}"
        assert "PermissionError" not in err and "Traceback" not in err, said
        if command in _NEEDED_BY[name]:
            text = out + err
            assert code == ExitCode.FAILURE and str(store / name) in text, said
            assert "EACCES" in text or "(Permission denied)" in text, said
            if command in ("get", "query") and name.endswith(".msgpack"):  # review 127 F5: nothing else lost
                assert len(out.splitlines()) == (3 if command == "get" else 1), said
        else:
            assert code == ExitCode.OK, said
    (store / name).chmod(0o644)
    assert snapshot(store) == before

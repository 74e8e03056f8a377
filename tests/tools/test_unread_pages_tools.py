"""`mqstore verify`, `inspect` and `dump` when a page of a segment faults while they read it (an
I/O error, or the file cut short by another process meanwhile): the SIGBUS guard's zeros were
reported as damage ("topic length 0 does not fit the record", exit 3, go run `recover`; review
67 F5). Now the segment is unreadable now, as one the command cannot map (review 65 F1): exit
1, the file and EIO named, what was read before the fault still reported, no byte changed.

The fault is made for real: the segment is cut to 8 KiB right after the command mapped it and
given its bytes back after the command. Each command runs in a forked child: a fault the guard
did not catch kills the child, not the test runner."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import traceback
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.cli import ExitCode, main
from mqstore.storage import fs as storage_fs
from mqstore.storage import mapguard

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

SEG = 64 * 1024


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=SEG) as s:
        for i in range(150):  # 3 segments
            assert s.put(mqstore.Message(topic="t", body=bytes([65 + i % 26]) * 1000, keys=[f"k{i}"])).ok
    monkeypatch.setenv("MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES", str(SEG))
    return root


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def _run_with_fault(argv: list[str], segment: Path) -> tuple[int, str]:
    """`mqstore <argv>` in a forked child, `segment` cut to 8 KiB once the command mapped it
    (its bytes back after the command); (exit code, stdout + stderr)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(read_end)
        try:
            real = storage_fs.RealFileSystem.map_file
            saved = segment.read_bytes()

            def map_then_cut(self: Any, path: str, size: int, **kwargs: Any) -> Any:
                region = real(self, path, size, **kwargs)
                if os.path.abspath(path) == str(segment):
                    os.truncate(segment, 8192)
                return region

            storage_fs.RealFileSystem.map_file = map_then_cut  # type: ignore[method-assign]
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = main(argv)
            finally:
                with open(segment, "r+b") as f:
                    f.write(saved)
            said = pickle.dumps((code, out.getvalue() + err.getvalue()))
        except BaseException:
            said = pickle.dumps((-1, traceback.format_exc()))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(said)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the command died of signal {os.WTERMSIG(status)}"
    code, text = pickle.loads(said)
    assert code != -1, text
    return code, text


@pytest.mark.parametrize("command", ["verify", "inspect", "dump"])
def test_a_page_that_faults_under_a_read_tool_is_unreadable_not_damage(store: Path, command: str) -> None:
    segment = sorted((store / "commitlog").iterdir())[1]
    before = _hashes(store)
    code, text = _run_with_fault([command, str(store), *(["--json"] if command != "dump" else [])], segment)
    assert code == ExitCode.FAILURE, (code, text[-3000:])
    assert "corrupt" not in text and "does not fit" not in text and "recover" not in text, text[-3000:]
    assert f"{segment}" in text and "EIO" in text, text[-3000:]
    if command == "verify":
        report = json.loads(text[: text.rindex("}") + 1])
        assert [p["kind"] for p in report["problems"]] == ["commitlog_unreadable"], report["problems"]
        assert report["unreadable_segments"] == 1 and report["messages"] >= 50  # segment 0's, and segment 1's before the page
    elif command == "inspect":
        report = json.loads(text[: text.rindex("}") + 1])
        assert report["verdict"] == "unreadable", report["problems"]
        assert [p["kind"] for p in report["problems"] if p["severity"] != "warning"] == ["segment_unreadable"]
        assert report["commitlog"]["segments"][1]["end"] == "unreadable" and report["commitlog"]["segments"][1]["messages"] > 0
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert len(rows) > 50 and "cannot be read now (EIO" in text, text[-2000:]
    assert _hashes(store) == before
    assert main(["verify", str(store)]) == ExitCode.OK  # the disk reads again: whole

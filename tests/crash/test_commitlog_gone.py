"""A store directory the store cannot open without guessing is refused before anything
changes (StoreDirectoryError). Above all, a store whose commitlog has no segment at all, beside
files that say it held messages: the log is away (a mount not up yet, a directory moved aside)
or looked for in the wrong place (`store_path_commitlog` other than when it was written).
Before, the open went ahead degraded and replaced every ConsumeQueue unit with a filler unit:
once the log was back, the queues read only their first message, as a duplicate."""

from __future__ import annotations

import contextlib
import hashlib
import os
import io
import shutil
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message
from mqstore.cli import main as cli_main

from crashlib import log_alone


def _ten(path: Path, **settings: Any) -> None:
    with mqstore.open(path, **settings) as store:
        for i in range(10):
            assert store.put(Message("t", b"m%d" % i, keys=["k%d" % i])).ok


def _all_ten_readable(path: Path) -> None:
    with mqstore.open(path) as store:
        got = store.get("t", 0, 0, 32)
        assert [(m.queue_offset, m.body) for m in got.messages] == [(i, b"m%d" % i) for i in range(10)]
        assert [m.body for m in store.query("t", "k9").messages] == [b"m9"]


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _file_digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _file_digest(path: Path) -> str:
    """The file's length and its data extents' places and bytes: a store of default geometry
    is 1.5 GB of sparse holes (read whole, each digest took seconds), and a byte written into
    a hole makes it data, so nothing written goes unseen."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f:
        position = 0
        while position < size:
            try:
                start = os.lseek(f.fileno(), position, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past `position`
                break
            end = os.lseek(f.fileno(), start, os.SEEK_HOLE)
            f.seek(start)
            digest.update(start.to_bytes(8, "big") + f.read(end - start))
            position = end
    digest.update(size.to_bytes(8, "big"))
    return digest.hexdigest()


def test_an_open_with_the_commitlog_directory_away_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _ten(path)
    shutil.move(str(path / "commitlog"), str(tmp_path / "aside"))
    shutil.rmtree(path / "config")  # as a broker's copy or an older store may be: none
    before = _digest(path)
    with pytest.raises(mqstore.StoreDirectoryError, match="holds no segment.*ConsumeQueue t-0 has files"):
        mqstore.open(path)
    after = _digest(path)
    assert after == before
    assert not (path / "abort").exists()
    assert not (path / "config").exists()  # a refused open makes no directory it would not need (review 32)
    assert not (path / "commitlog").exists()  # nor leaves one it made, empty (review 116 L1)
    shutil.move(str(tmp_path / "aside"), str(path / "commitlog"))
    _all_ten_readable(path)


def test_an_open_with_another_store_path_commitlog_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _ten(path)
    with pytest.raises(mqstore.StoreDirectoryError, match="store_path_commitlog"):
        mqstore.open(path, store_path_commitlog=str(tmp_path / "elsewhere"))
    _all_ten_readable(path)


def test_recover_refuses_too(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _ten(path)
    shutil.move(str(path / "commitlog"), str(tmp_path / "aside"))
    (path / "commitlog").mkdir()
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(["recover", "--no-progress", str(path)])
    assert code == 5 and "holds no segment" in err.getvalue()
    shutil.rmtree(path / "commitlog")
    shutil.move(str(tmp_path / "aside"), str(path / "commitlog"))
    _all_ten_readable(path)


@pytest.mark.parametrize("command", ["get", "query", "verify"])
def test_read_only_commands_refuse_a_commitlog_directory_without_a_segment(
    tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 35 F6: with store_path_commitlog naming an empty directory, get and query
    answered "no message", exit 0, for a store holding ten; the open and recover refuse it."""
    path = tmp_path / "s"
    _ten(path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("MQSTORE_STORE_PATH_COMMITLOG", str(tmp_path / "elsewhere"))
    extra = {"get": ["--topic", "t", "--queue", "0", "--offset", "0"], "query": ["--topic", "t", "--key", "k1"],
             "verify": []}[command]  # fmt: skip
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main([command, *extra, str(path)])
    assert code == 5 and "holds no segment" in err.getvalue(), err.getvalue()


def test_inspect_says_the_commitlog_is_away_not_that_recovery_truncates_the_queues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 35 F6: inspect called the units "past the commitlog's end (recovery truncates
    them)", where recovery refuses the store."""
    path = tmp_path / "s"
    _ten(path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("MQSTORE_STORE_PATH_COMMITLOG", str(tmp_path / "elsewhere"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(["inspect", str(path)])
    assert code != 0 and "holds no segment" in out.getvalue(), out.getvalue()
    assert "recovery truncates them" not in out.getvalue()


def test_the_checkpoint_alone_is_enough_to_refuse(tmp_path: Path) -> None:
    """No queue or index file (deleted as derived), but the checkpoint says messages were flushed."""
    path = tmp_path / "s"
    _ten(path, message_index_enable=False)
    shutil.rmtree(path / "consumequeue")
    shutil.rmtree(path / "commitlog")
    with pytest.raises(mqstore.StoreDirectoryError, match="checkpoint says messages were flushed"):
        mqstore.open(path, message_index_enable=False)


def test_a_new_store_and_an_empty_one_still_open(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "new"):
        pass
    with mqstore.open(tmp_path / "new") as store:  # closed with no message: nothing says otherwise
        assert store.put(Message("t", b"x")).ok


@pytest.mark.parametrize("name", ["", "commitlog", "consumequeue", "index", "checkpoint"])
def test_something_in_the_way_of_the_stores_own_paths_is_a_store_directory_error(tmp_path: Path, name: str) -> None:
    """A file where the store or one of its directories belongs, or a directory where its
    checkpoint does: refused before anything is made, and nothing changes."""
    root = tmp_path / "s"
    if name == "":
        root.write_bytes(b"in the way")
    else:
        with mqstore.open(root):
            pass
        target = root / name
        if target.is_dir():
            shutil.rmtree(target)
            target.write_bytes(b"in the way")
        else:
            target.unlink()
            target.mkdir()
    before = _digest(tmp_path)
    with pytest.raises(mqstore.StoreDirectoryError, match="belongs|keeps its checkpoint"):
        mqstore.open(root)
    assert _digest(tmp_path) == before


def test_recover_fills_the_only_segment_from_the_copy_a_run_without_room_set_aside(tmp_path: Path) -> None:
    """A `mqstore recover` that found no room to fill a wrong-sized segment leaves it set aside
    as NAME.damaged, for the next run to fill from. When it was the log's only segment, an open
    is refused with that advice (not "remove the store": it is the only copy of the records),
    and the next recover fills it."""
    settings = {"mapped_file_size_commitlog_bytes": 1 << 20}
    root = tmp_path / "s"
    with mqstore.open(root, **settings) as store:
        for i in range(10):
            assert store.put(Message("t", b"m%d" % i, keys=["k%d" % i])).ok
    segment = root / "commitlog" / ("%020d" % 0)
    (root / "commitlog" / (segment.name + ".damaged")).write_bytes(segment.read_bytes()[: 64 << 10])
    segment.unlink()
    with pytest.raises(mqstore.StoreDirectoryError, match="run `mqstore recover` again"):
        mqstore.open(root, **settings)
    toml = tmp_path / "store.toml"
    toml.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(["--config", str(toml), "recover", "--no-progress", str(root)])
    assert code == 0, err.getvalue()
    with mqstore.open(root, **settings) as store:
        assert [m.body for m in store.get("t", 0, 0, 32).messages] == [b"m%d" % i for i in range(10)]
        assert [m.body for m in store.query("t", "k9").messages] == [b"m9"]


@pytest.mark.parametrize(
    "layout",
    ["index file a directory", "queue segment a directory", "later queue segment a directory",
     "commitlog segment a directory", "topic a file", "queue a file"],
)  # fmt: skip
def test_a_directory_or_file_in_the_place_of_a_segment_or_queue_is_a_store_directory_error(
    tmp_path: Path, layout: str
) -> None:
    """Where a segment file or a queue's directory belongs, something else: refused at once,
    naming it, and nothing changes. Before, an index file that was a directory failed the open
    with a bare OSError (ENODEV); a queue's first segment that was a directory, or a file where
    a topic's or queue's directory belongs, failed it after ~6 s of restarts with "the
    consume_queue actor kept failing"; and a directory named as a later segment of a queue or
    of the log opened, to stop the writer when the log got there."""
    root = tmp_path / "s"
    _ten(root, mapped_file_size_commitlog_bytes=1 << 20, max_hash_slot_num=64, max_index_num=400)  # small to hash
    queue = root / "consumequeue" / "t" / "0"
    if layout == "index file a directory":
        target = next((root / "index").iterdir())
        target.unlink()
        target.mkdir()
    elif layout == "queue segment a directory":
        target = next(queue.iterdir())
        target.unlink()
        target.mkdir()
    elif layout == "later queue segment a directory":
        target = queue / ("%020d" % (300_000 * 20 * 50))
        target.mkdir()
    elif layout == "commitlog segment a directory":
        target = root / "commitlog" / ("%020d" % (3 << 30))
        target.mkdir()
    elif layout == "topic a file":
        target = root / "consumequeue" / "t"
        shutil.rmtree(target)
        target.write_bytes(b"in the way")
    else:
        target = queue
        shutil.rmtree(target)
        target.write_bytes(b"in the way")
    before = _digest(tmp_path)
    with pytest.raises(mqstore.StoreDirectoryError, match=str(target)):
        mqstore.open(root)
    assert _digest(tmp_path) == before
    assert not (root / "abort").exists()


# Review 45 F2/F3: store_path_commitlog set to a log that is there but not this store's.

# Small index files too: the digests read every file whole (a default index file is 420 MB).
_SMALL = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 2000,
          "max_hash_slot_num": 1000, "max_index_num": 4000}  # fmt: skip


def _three_queues(path: Path, n: int, prefix: bytes) -> None:
    with mqstore.open(path, **_SMALL) as store:
        for i in range(n):
            assert store.put(Message("T%d" % (i % 3), prefix + b"-%05d" % i + b"." * 180, keys=["k%d" % i])).ok


def _served(store: mqstore.MessageStore) -> int:
    served = 0
    for q in range(3):
        offset = 0
        while (got := store.get("T%d" % q, 0, offset, 32)).messages:
            served += len(got.messages)
            offset = got.next_begin_offset
    return served


@pytest.mark.parametrize("how", ["open", "recover"])
@pytest.mark.parametrize("whose", ["another_store", "own_queue_dir"])
def test_a_commitlog_directory_of_another_log_is_refused_and_nothing_changes(tmp_path: Path, how: str, whose: str) -> None:
    """Before: the open cut every queue to the other log and dropped index files, and
    `recover` rewrote every queue, deleted index files and wrote filler segments into the
    other store (or renamed and grew a queue file into a 1 GiB "segment")."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    _three_queues(mine, 900, b"mine")
    _three_queues(other, 150, b"other")
    elsewhere = log_alone(other) if whose == "another_store" else mine / "consumequeue" / "T0" / "0"
    before = (_digest(mine), _digest(other))
    # (one of the store's own queue directories is refused by where it lies, before it is read)
    said = "is not this store's" if whose == "another_store" else "is inside the store's consumequeue"
    if how == "open":
        with pytest.raises(mqstore.StoreDirectoryError, match=f"{said}.*store_path_commitlog|store_path_commitlog.*{said}"):
            mqstore.open(mine, store_path_commitlog=str(elsewhere), **_SMALL)
    else:
        err = io.StringIO()
        env = {"MQSTORE_STORE_PATH_COMMITLOG": str(elsewhere)}
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            for key, value in env.items():
                mp.setenv(key, value)
            code = cli_main(["recover", "--no-progress", str(mine)])
        assert code != 0 and said in err.getvalue()
    assert (_digest(mine), _digest(other)) == before
    with mqstore.open(mine, **_SMALL) as store:
        assert _served(store) == 900


def test_a_log_whose_oldest_records_are_damaged_is_still_this_stores(tmp_path: Path) -> None:
    """The newest units vouch for the log: damage at its start is damage, not another log."""
    path = tmp_path / "s"
    _three_queues(path, 900, b"mine")
    first = path / "commitlog" / ("%020d" % 0)
    data = bytearray(first.read_bytes())
    data[:4096] = b"\xa5" * 4096  # the first records of every queue
    first.write_bytes(bytes(data))
    with mqstore.open(path, **_SMALL) as store:
        assert store.running and 800 < _served(store) < 900


@pytest.mark.parametrize("command", ["get", "query", "verify"])
def test_read_only_commands_refuse_a_commitlog_directory_of_another_log(tmp_path: Path, command: str) -> None:
    """Review 45 F3/F6: `get` answered an empty queue with exit 0 for a queue of 300."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    _three_queues(mine, 900, b"mine")
    _three_queues(other, 150, b"other")
    args = {"get": ["--topic", "T0", "--queue", "0", "--offset", "0"], "query": ["--topic", "T0", "--key", "k0"],
            "verify": []}[command]  # fmt: skip
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        mp.setenv("MQSTORE_STORE_PATH_COMMITLOG", str(other / "commitlog"))
        code = cli_main([command, str(mine), *args])
    assert code == 5 and "is not this store's" in err.getvalue()


def test_a_read_only_command_on_a_running_store_does_not_advise_recover(tmp_path: Path) -> None:
    """Review 45 F4: its abort file is there because it runs, and `recover` refuses a running store."""
    path = tmp_path / "s"
    with mqstore.open(path) as store:
        assert store.put(Message("t", b"x")).ok
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            assert cli_main(["stats", str(path)]) == 0
        assert "open in a running process" in err.getvalue() and "recover" not in err.getvalue()


def test_a_segment_that_cannot_be_opened_is_named_with_its_error(tmp_path: Path) -> None:
    """Review 45 F7: "cannot load the commitlog in DIR" named neither the file nor the errno."""
    import os
    import subprocess

    path = tmp_path / "s"
    _ten(path)
    segment = path / "commitlog" / ("%020d" % 0)
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr to make a segment immutable")
    if subprocess.run(["chattr", "+i", str(segment)], capture_output=True).returncode != 0:
        pytest.skip(f"the filesystem of {tmp_path} does not take chattr +i")
    try:
        with pytest.raises(OSError, match=r"00000000000000000000.*(Operation not permitted|Permission denied)"):
            mqstore.open(path)
    finally:
        subprocess.run(["chattr", "-i", str(segment)], check=True)
    _all_ten_readable(path)


@pytest.mark.parametrize("name", ["99999999999999999999", "09223372036854775808"])
def test_a_file_named_past_the_largest_offset_is_refused_never_removed(tmp_path: Path, name: str) -> None:
    """Review 52 L2: a full-size file named 99999999999999999999 (past 2^63 - 1: no log reaches
    it, and RocketMQ's Long.parseLong refuses it) was taken for a hole, then removed as an
    unwritten segment past the end, its data with it. Now the open refuses, naming it, and
    changes nothing; moved out, the store opens as before. Review 52 L1: the open said so in a
    bare OSError, and `recover` and every read-only command failed on the geometry its name
    gave (exit 2) or on an OverflowError (exit 1): each is StoreDirectoryError now, exit 5."""
    path = tmp_path / "s"
    _ten(path, **_SMALL)
    stray = path / "commitlog" / name
    shutil.copy(path / "commitlog" / ("%020d" % 0), stray)
    before = _digest(path)
    with pytest.raises(mqstore.StoreDirectoryError, match=f"{name} is named past the largest offset"):
        mqstore.open(path, **_SMALL)
    for command, *args in (["recover", "--no-progress"], ["verify"], ["inspect"], ["stats"], ["dump"], ["clean"],
                           ["get", "--topic", "t", "--queue", "0", "--offset", "0"], ["query", "--topic", "t", "--key", "k1"]):  # fmt: skip
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = cli_main([command, *args, str(path)])
        assert (code, f"{name} is named past the largest offset" in err.getvalue()) == (5, True), (command, err.getvalue())
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):  # a directory named on its own
        code = cli_main(["dump", "--commitlog-dir", str(path / "commitlog"), str(tmp_path)])
    assert (code, f"{name} is named past the largest offset" in err.getvalue()) == (5, True), err.getvalue()
    assert _digest(path) == before
    stray.rename(tmp_path / "stray")
    _all_ten_readable(path)


def test_a_store_whose_sampled_records_are_all_damaged_still_opens(tmp_path: Path) -> None:
    """Review 47 F1: sixteen queues (the ones sampled) each with one record, all in a damaged
    first 4 KiB, beside a queue of 300 intact records: refused as "not this store's" for good
    (open and recover alike). Damaged bytes are no evidence of another log."""
    path = tmp_path / "s"
    with mqstore.open(path, **_SMALL) as store:
        for q in range(16):
            assert store.put(Message("A%02d" % q, b"audit")).ok
        for i in range(300):
            assert store.put(Message("orders", b"o-%04d" % i + b"." * 100)).ok
    first = path / "commitlog" / ("%020d" % 0)
    data = bytearray(first.read_bytes())
    data[:4096] = b"\xa5" * 4096
    first.write_bytes(bytes(data))
    with mqstore.open(path, **_SMALL) as store:
        served, offset = 0, 0
        while (got := store.get("orders", 0, offset, 32)).messages:
            served += len(got.messages)
            offset = got.next_begin_offset
        assert served >= 280


@pytest.mark.parametrize("case", ["same_sized_first_records", "one_queue_into_a_smaller_log"])
def test_another_log_that_looks_alike_is_still_refused(tmp_path: Path, case: str) -> None:
    """Review 47 F2: two stores whose first records have one size (fixed-size bodies) matched on
    size, queue and offsets alone; a one-queue store's units met the smaller other log once."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    if case == "same_sized_first_records":
        for path, topic, n in ((mine, "orders", 900), (other, "events", 150)):
            with mqstore.open(path, **_SMALL) as store:
                for i in range(n):
                    assert store.put(Message(topic, b"%08d" % i + b"." * 248, queue_id=i % 2)).ok
    else:
        with mqstore.open(mine, **_SMALL) as store:
            for i in range(1200):
                assert store.put(Message("orders", b"o-%05d" % i + b"." * (i % 300))).ok
        _three_queues(other, 150, b"other")
    before = (_digest(mine), _digest(other))
    with pytest.raises(mqstore.StoreDirectoryError, match="is not this store's"):
        mqstore.open(mine, store_path_commitlog=str(log_alone(other)), **_SMALL)
    assert (_digest(mine), _digest(other)) == before


@pytest.mark.parametrize("directory", ["commitlog", "consumequeue", "index", "config"])
def test_a_data_directory_linked_to_a_mount_that_is_not_up_is_refused_before_anything_changes(
    tmp_path: Path, directory: str
) -> None:
    """Review 54 M1: a data directory that is a symbolic link to nothing passed the checks
    (they follow links); the open and `recover` failed on a bare FileExistsError (exit 1), and
    `recover` with `config` dangling first cut every queue and dropped the index. Now both
    refuse at once, naming the link and where it points (exit 5), and change nothing."""
    path = tmp_path / "s"
    _ten(path)
    (path / "abort").write_bytes(b"")  # after a crash: recover has work to do
    (path / directory).rename(tmp_path / "away")
    (path / directory).symlink_to(tmp_path / "not-mounted")
    before = _digest(path)
    with pytest.raises(mqstore.StoreDirectoryError, match="symbolic link to .*not-mounted, which does not exist"):
        mqstore.open(path)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(["recover", "--no-progress", str(path)])
    assert code == 5, err.getvalue()
    assert _digest(path) == before and (path / directory).is_symlink()
    (path / directory).unlink()
    (tmp_path / "away").rename(path / directory)
    _all_ten_readable(path)

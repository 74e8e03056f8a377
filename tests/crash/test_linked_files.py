"""A store never writes through a link into another file (review 26, F3). Its segments,
ConsumeQueue and index files, checkpoint and lock are written in place: a `lock` that was a
symbolic or hard link to a commitlog segment had the segment's first acknowledged record
overwritten by the lock's four bytes at the next open, and a hard-linked copy (`cp -al`, rsync
--link-dest) shares every segment with its original, so a put in either overwrote what the
other had acknowledged. Such a store is refused (StoreDirectoryError, exit 5 from the command
line) before any byte changes; `mqstore recover`, which writes the same files, refuses it too."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import shutil
from pathlib import Path

import pytest

import mqstore
from mqstore import Message
from mqstore.cli import ExitCode
from mqstore.cli import main as cli_main
from mqstore.storage.fs import RealFileSystem

SMALL = {"mapped_file_size_commitlog_bytes": 1 << 20, "max_hash_slot_num": 64, "max_index_num": 400}


def _store(root: Path) -> None:
    with mqstore.open(root, **SMALL) as store:
        for i in range(10):
            assert store.put(Message("t", b"m%d" % i, keys=["k%d" % i])).ok


def _state(*roots: Path) -> dict[str, tuple[str, int]]:
    """Every entry's content and mtime, links included, under each root."""
    seen: dict[str, tuple[str, int]] = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_symlink():
                seen[str(p)] = ("-> " + os.readlink(p), 0)
            elif p.is_file():
                seen[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return seen


def _recover(root: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["recover", str(root), "--no-progress"])
    return code, err.getvalue()


@pytest.mark.parametrize("link", ["symbolic", "hard", "dangling"])
def test_a_lock_linked_elsewhere_is_refused_and_the_linked_file_keeps_its_bytes(tmp_path: Path, link: str) -> None:
    root = tmp_path / "store"
    _store(root)
    segment = root / "commitlog" / "00000000000000000000"
    lock = root / "lock"
    lock.unlink()
    if link == "symbolic":
        lock.symlink_to(segment)
    elif link == "hard":
        os.link(segment, lock)
    else:
        lock.symlink_to(tmp_path / "nowhere")
    before = _state(root)
    with pytest.raises(mqstore.StoreDirectoryError, match="lock.*(symbolic link|hard links)"):
        mqstore.open(root)
    code, message = _recover(root)
    assert code == ExitCode.NOT_A_STORE and "lock" in message, message
    assert _state(root) == before
    assert not (tmp_path / "nowhere").exists()
    lock.unlink()
    with mqstore.open(root) as store:  # the link moved aside: every acknowledged record is there
        assert [m.body for m in store.get("t", 0, 0, 32).messages] == [b"m%d" % i for i in range(10)]


def test_a_hard_linked_copy_is_refused_on_both_sides_and_neither_changes(tmp_path: Path) -> None:
    """`cp -al original copy`: a put into the copy would land in the original's segment,
    after the records it acknowledged, and the original's next put over the copy's."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    _store(original)
    for directory, _dirs, files in os.walk(original):
        target = copy / Path(directory).relative_to(original)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(Path(directory) / name, target / name)
    before = _state(original, copy)
    for root in (copy, original):
        with pytest.raises(mqstore.StoreDirectoryError, match=r"hard links.*cp -a"):
            mqstore.open(root)
        code, message = _recover(root)
        assert code == ExitCode.NOT_A_STORE and "hard links" in message, message
    assert _state(original, copy) == before
    for path in sorted(p for p in copy.rglob("*") if p.is_file()):  # each file copied (cp -a): both open
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
    for root in (original, copy):
        with mqstore.open(root) as store:
            assert store.put(Message("t", root.name.encode())).ok
    for root in (original, copy):
        with mqstore.open(root) as store:
            assert [m.body for m in store.get("t", 0, 0, 32).messages] == [b"m%d" % i for i in range(10)] + [root.name.encode()]


@pytest.mark.parametrize("which", ["segment", "consume_queue", "index", "checkpoint"])
def test_a_store_file_that_is_a_symbolic_link_is_refused(tmp_path: Path, which: str) -> None:
    root = tmp_path / "store"
    _store(root)
    path = {
        "segment": root / "commitlog" / "00000000000000000000",
        "consume_queue": root / "consumequeue" / "t" / "0" / "00000000000000000000",
        "index": next((root / "index").iterdir()),
        "checkpoint": root / "checkpoint",
    }[which]
    elsewhere = tmp_path / "elsewhere"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    before = _state(root), hashlib.sha256(elsewhere.read_bytes()).hexdigest()
    with pytest.raises(mqstore.StoreDirectoryError, match=f"{path.name} is a symbolic link to {elsewhere}"):
        mqstore.open(root)
    assert (_state(root), hashlib.sha256(elsewhere.read_bytes()).hexdigest()) == before


@pytest.mark.parametrize("shared", ["commitlog", "consumequeue", "index", "config"])
def test_a_directory_reached_from_two_store_roots_is_held_by_one_store_at_a_time(tmp_path: Path, shared: str) -> None:
    """`cp -a` of a store whose commitlog directory is a link (the usual way to put the log on
    another disk) copies the link: both stores then wrote one directory, each at its own end of
    the log, each over what the other had acknowledged (review 28 F9)."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    _store(original)
    _store(copy)
    if shared == "config":  # the committed consumer offsets' directory
        for root in (original, copy):
            with mqstore.open(root, **SMALL) as store:
                store.commit_offset("g", "t", 0, 3)
    # The original's directory on another disk (a link), and the copy's link copied with it:
    # one directory outside both roots. (A link into the original's root itself is refused
    # whether the original runs or not: test_a_store_inside_another_stores_directories_...)
    (original / shared).rename(tmp_path / "elsewhere")
    (original / shared).symlink_to(tmp_path / "elsewhere")
    (copy / shared).rename(tmp_path / "copy-own")
    (copy / shared).symlink_to(tmp_path / "elsewhere")
    with mqstore.open(original, **SMALL) as store:
        before = _state(original / shared)
        with pytest.raises(mqstore.StoreLockedError, match=f"{copy / shared} is held by another store"):
            mqstore.open(copy, **SMALL)
        code, message = _recover(copy)
        assert code == ExitCode.LOCKED and "is held by another store" in message, message
        assert _state(original / shared) == before  # the refused opens wrote nothing into it
        assert store.put(Message("t", b"after")).ok  # and it is still the original's
    with mqstore.open(copy, **SMALL):  # once the original is closed, the link is the copy's to use
        pass


def test_two_of_a_stores_directories_that_are_one_directory_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root)
    (root / "index").rename(tmp_path / "index-own")
    (root / "index").symlink_to(root / "consumequeue")
    before = _state(root / "consumequeue")
    with pytest.raises(mqstore.StoreDirectoryError, match="are one directory"):
        mqstore.open(root, **SMALL)
    assert _state(root / "consumequeue") == before


@pytest.mark.parametrize("level", ["topic", "queue"])
def test_a_consume_queue_directory_linked_into_another_store_is_refused(tmp_path: Path, level: str) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _store(one)
    _store(two)
    linked = two / "consumequeue" / "t" if level == "topic" else two / "consumequeue" / "t" / "0"
    target = one / linked.relative_to(two)
    linked.rename(tmp_path / "two-own")
    linked.symlink_to(target)
    before = _state(one)
    with pytest.raises(mqstore.StoreDirectoryError, match=f"{linked} is a symbolic link to {target}"):
        mqstore.open(two, **SMALL)
    code, message = _recover(two)
    assert code == ExitCode.NOT_A_STORE and linked.name in message, message
    assert _state(one) == before


@pytest.mark.parametrize("running", [False, True], ids=["stopped", "running"])
def test_a_link_in_the_consume_queue_directory_not_named_as_a_topic_is_left_alone(tmp_path: Path, running: bool) -> None:
    """Not named as a topic may be: not the store's. The link check let it pass (review 30),
    but loading still took it for a queue and cut another store's queue files through it:
    a running store served 20 of its 500 messages (review 32). Neither looks at it now."""
    one, two = tmp_path / "one", tmp_path / "two"
    with mqstore.open(one, **SMALL) as store:
        for i in range(50):
            assert store.put(Message("t", b"m%d" % i)).ok
    _store(two)  # 10 messages of its own in t-0: fewer than one's
    (two / "consumequeue" / "old.bak").symlink_to(one / "consumequeue" / "t")
    before = _state(one)
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(mqstore.open(one, **SMALL)) if running else None
        with mqstore.open(two, **SMALL) as store:
            assert store.put(mqstore.Message("t", b"after")).ok
        assert _recover(two)[0] == ExitCode.OK
        if first is not None:
            got = first.get("t", 0, 20, 32)  # through its ConsumeQueue, as a consumer reads
            assert [m.body for m in got.messages] == [b"m%d" % i for i in range(20, 50)]
    if not running:
        assert _state(one) == before


@pytest.mark.parametrize("inside", ["consumequeue/U/0", "consumequeue/T/0", "consumequeue/T", "index/sub", "config/sub"])
def test_a_commitlog_directory_inside_another_of_the_stores_directories_is_refused(
    tmp_path: Path, inside: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 116 F2: store_path_commitlog inside the store's consumequeue/<topic>/<queue>
    was accepted: its segments share the 20-digit names of queue files there, so a queue's
    writer wrote over acknowledged records (T/0), or the next open took the segments for a
    damaged queue's files and set them aside (U/0: 0 of 600 served after a clean close).
    Refused at the first open, before anything is made."""
    new = tmp_path / "new"
    with pytest.raises(mqstore.StoreDirectoryError, match="inside the store's"):
        mqstore.open(new, store_path_commitlog=str(new / inside), **SMALL)
    assert not new.exists()
    # A store laid out so by an mqstore before this check: refused too, no byte changed.
    root = tmp_path / "store"
    _store(root)
    (root / inside).parent.mkdir(parents=True, exist_ok=True)
    (root / "commitlog").rename(root / inside)
    before = _state(root)
    with pytest.raises(mqstore.StoreDirectoryError, match="inside the store's"):
        mqstore.open(root, store_path_commitlog=str(root / inside), **SMALL)
    monkeypatch.setenv("MQSTORE_STORE_PATH_COMMITLOG", str(root / inside))
    code, message = _recover(root)
    assert code == ExitCode.NOT_A_STORE and "inside the store's" in message, message
    assert _state(root) == before


@pytest.mark.parametrize("running", [False, True])
@pytest.mark.parametrize(("root_at", "commitlog_at"), [
    ("x", "a/consumequeue/t/0"), ("x", "a/consumequeue/t"), ("x", "a/index/sub"), ("x", "a"),
    ("a/consumequeue", None), ("a/consumequeue/t/0", None), ("a/commitlog", None), ("a/index", None),
    ("a/config", None),
])  # fmt: skip
def test_a_store_inside_another_stores_directories_is_refused_and_changes_nothing(
    tmp_path: Path, root_at: str, commitlog_at: str | None, running: bool
) -> None:
    """Review 130 F2: a new store whose store_path_commitlog was another store's
    consumequeue/t/0 opened (a new store has no queues, so the check that the files are a log
    did not run), wrote its record over that queue's units, and its recovery deleted two of
    them. F3: a store rooted inside another's consumequeue put its checkpoint and lock there,
    and the other store no longer opened. Refused before anything is made, the other store
    running or not."""
    a = tmp_path / "a"
    _store(a)
    with contextlib.ExitStack() as stack:
        if running:
            stack.enter_context(mqstore.open(a, **SMALL))
        def files_of_a() -> tuple[set[str], dict[str, str]]:
            """Its names and the bytes of its log, queues and index; running, those bytes only
            (`a` rewrites its checkpoint and snapshots on its own, through temporary files)."""
            state = _state(a)
            data = tuple(str(a / d) + os.sep for d in ("commitlog", "consumequeue", "index"))
            return set() if running else set(state), {p: d for p, (d, _mtime) in state.items() if p.startswith(data)}

        before = files_of_a()
        settings = dict(SMALL) if commitlog_at is None else {**SMALL, "store_path_commitlog": str(tmp_path / commitlog_at)}
        with pytest.raises(mqstore.StoreDirectoryError, match="another store"):
            mqstore.open(tmp_path / root_at, **settings)  # type: ignore[arg-type]
        if commitlog_at is None:  # the same through a link to it
            (tmp_path / "link").symlink_to(tmp_path / root_at)
            with pytest.raises(mqstore.StoreDirectoryError, match="another store"):
                mqstore.open(tmp_path / "link", **settings)  # type: ignore[arg-type]
        assert files_of_a() == before
    with mqstore.open(a, **SMALL) as reopened:
        assert [bytes(m.body) for m in reopened.get("t", 0, 0, 32).messages] == [b"m%d" % i for i in range(10)]


def test_a_store_beside_another_inside_the_same_directory_opens(tmp_path: Path) -> None:
    """Not every directory below another store's root is that store's: one beside its own
    directories is not refused."""
    _store(tmp_path / "a")
    _store(tmp_path / "a" / "mine")


@pytest.mark.parametrize("inside", ["consumequeue/foo", "consumequeue/t/0/foo", "commitlog/foo", "index/foo", "config/foo",
                                    "consumequeue/20261201000000000", "config/20261201000000000/s"])  # fmt: skip
def test_a_new_store_made_around_another_is_refused_and_changes_nothing(tmp_path: Path, inside: str) -> None:
    """Review 133 F2: a new store at N whose directories already held another store's root
    (N/consumequeue/foo) opened, and that store no longer opened (it lay inside another's)."""
    new = tmp_path / "n"
    _store(new / inside)
    before = _state(new)
    with pytest.raises(mqstore.StoreDirectoryError, match="another store's root"):
        mqstore.open(new, **SMALL)
    assert _state(new) == before
    with mqstore.open(new / inside, **SMALL) as reopened:
        assert len(reopened.get("t", 0, 0, 32).messages) == 10


def test_a_new_store_in_another_stores_commitlog_directory_is_refused(tmp_path: Path) -> None:
    """Review 133 F3: a store whose store_path_commitlog lies outside its root; a new store
    rooted in that directory opened and wrote its checkpoint and directories among the
    segments, and the other store no longer opened."""
    a, log = tmp_path / "a", tmp_path / "a-log"
    with mqstore.open(a, store_path_commitlog=str(log), **SMALL) as store:
        assert store.put(Message("t", b"m")).ok
    before = _state(a, log)
    with pytest.raises(mqstore.StoreDirectoryError, match="named as commitlog segments"):
        mqstore.open(log, **SMALL)
    assert _state(a, log) == before
    # Refused for its commitlog's content (after its root was made): no new root left behind.
    other_log = tmp_path / "n-log"
    shutil.copytree(a / "consumequeue" / "t" / "0", other_log)
    with pytest.raises(mqstore.StoreDirectoryError, match="holds a commitlog record"):
        adopted = {k: v for k, v in SMALL.items() if k != "mapped_file_size_commitlog_bytes"}  # (the file's size)
        mqstore.open(tmp_path / "n", store_path_commitlog=str(other_log), **adopted)
    assert not (tmp_path / "n").exists()
    with mqstore.open(a, store_path_commitlog=str(log), **SMALL) as reopened:
        assert [bytes(m.body) for m in reopened.get("t", 0, 0, 8).messages] == [b"m"]


class _AnotherOpenerFillsTheRoot(RealFileSystem):
    """Another process's store appears in `root` just as a refused open takes away the root it
    made, after it found the root empty."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = str(root)

    def _fill(self, path: str) -> None:
        if path == self.root:
            (Path(self.root) / "another-opener").write_bytes(b"its store")

    def rmdir(self, path: str) -> None:
        self._fill(path)
        super().rmdir(path)


def test_a_refused_open_never_removes_what_another_opener_put_in_the_root_it_made(tmp_path: Path) -> None:
    """Review 134 F2: the refused open listed its new root, found it empty and removed it
    whole; another process that had opened the same new root in between lost its store."""
    a = tmp_path / "a"
    _store(a)
    queue_files = tmp_path / "queue-files"
    shutil.copytree(a / "consumequeue" / "t" / "0", queue_files)
    new = tmp_path / "n"
    adopted = {k: v for k, v in SMALL.items() if k != "mapped_file_size_commitlog_bytes"}
    with pytest.raises(mqstore.StoreDirectoryError, match="holds a commitlog record"):
        mqstore.open(new, store_path_commitlog=str(queue_files), fs=_AnotherOpenerFillsTheRoot(new), **adopted)  # type: ignore[arg-type]
    assert (new / "another-opener").read_bytes() == b"its store"


def test_a_refused_open_removes_the_parent_directories_it_made_too(tmp_path: Path) -> None:
    """Review 134 F4: a refused open removed the new root it made, but not the parents its
    makedirs made for it (`p/x` of a refused new `p/x/y`); a parent that was there stays."""
    a = tmp_path / "a"
    _store(a)
    queue_files = tmp_path / "queue-files"
    shutil.copytree(a / "consumequeue" / "t" / "0", queue_files)
    adopted = {k: v for k, v in SMALL.items() if k != "mapped_file_size_commitlog_bytes"}
    with pytest.raises(mqstore.StoreDirectoryError, match="holds a commitlog record"):
        mqstore.open(tmp_path / "p" / "x" / "y", store_path_commitlog=str(queue_files), **adopted)
    assert not (tmp_path / "p").exists()
    (tmp_path / "q").mkdir()
    with pytest.raises(mqstore.StoreDirectoryError, match="holds a commitlog record"):
        mqstore.open(tmp_path / "q" / "x" / "y", store_path_commitlog=str(queue_files), **adopted)
    assert list((tmp_path / "q").iterdir()) == []


class _AnotherWriterFillsOnRemoval(RealFileSystem):
    """Another process writes a file into a directory just as the store takes it away, after
    the store found it empty."""

    def __init__(self, *directories: Path) -> None:
        super().__init__()
        self.directories = {str(d) for d in directories}

    def listdir(self, path: str) -> list[str]:
        names = super().listdir(path)
        if path in self.directories and not names:
            (Path(path) / "another-writer").write_bytes(b"its file")
        return names


def test_a_cleaned_topic_never_takes_what_another_writer_put_in_its_directories(tmp_path: Path) -> None:
    """Review 135 (code reading): a cleaned topic's queue directory and topic directory were
    listed, found empty, then removed recursively: a file put there in between went too."""
    root = tmp_path / "s"
    topic_dir = root / "consumequeue" / "gone"
    fs = _AnotherWriterFillsOnRemoval(topic_dir, topic_dir / "0")
    with mqstore.open(root, fs=fs, **SMALL) as store:  # type: ignore[arg-type]
        assert store.put(Message("gone", b"m")).ok and store.put(Message("kept", b"k")).ok
        store.flush()
        assert store.wait_for_messages("gone", 0, 0, 10)
        assert store.clean_unused_topic(keep=["kept"]) == 1
    assert (topic_dir / "0" / "another-writer").read_bytes() == b"its file"


def test_a_refused_open_never_removes_a_commitlog_directory_another_store_made_and_holds(tmp_path: Path) -> None:
    """Review 138 F1: two new stores named one new store_path_commitlog C. B found C missing,
    A made C and opened, and B, refused for C (held), removed C, still empty before A's first
    put; a third store then opened on C beside A, and A's acknowledged messages were lost."""
    shared_log = tmp_path / "shared-commitlog"
    opened: list[mqstore.MessageStore] = []

    class _AnotherStoreOpensFirst(RealFileSystem):
        def makedirs(self, path: str) -> None:
            if path == str(shared_log) and not opened:
                opened.append(mqstore.open(tmp_path / "a", store_path_commitlog=str(shared_log), **SMALL))
            super().makedirs(path)

    with pytest.raises(mqstore.StoreLockedError, match="is held by another store"):
        mqstore.open(tmp_path / "b", store_path_commitlog=str(shared_log), fs=_AnotherStoreOpensFirst(), **SMALL)  # type: ignore[arg-type]
    with opened[0] as a:
        assert shared_log.is_dir()
        with pytest.raises(mqstore.StoreLockedError, match="is held by another store"):
            mqstore.open(tmp_path / "d", store_path_commitlog=str(shared_log), **SMALL)
        assert all(a.put(Message("t", b"m%d" % i)).ok for i in range(20))
        assert [bytes(m.body) for m in a.get("t", 0, 0, 32).messages] == [b"m%d" % i for i in range(20)]


def test_a_claim_on_a_directory_removed_while_the_store_opened_is_refused(tmp_path: Path) -> None:
    """The other side of review 138 F1: a directory the open made, taken away before the open
    holds it, is refused rather than claimed (the writer would make it again, unclaimed)."""
    log = tmp_path / "log"

    class _RemovedAfterMade(RealFileSystem):
        def makedirs(self, path: str) -> None:
            super().makedirs(path)
            if path == str(log):
                os.rmdir(path)

    with pytest.raises(mqstore.StoreDirectoryError, match="was removed while the store opened"):
        mqstore.open(tmp_path / "s", store_path_commitlog=str(log), fs=_RemovedAfterMade(), **SMALL)  # type: ignore[arg-type]
    assert not (tmp_path / "s").exists()


def test_a_root_that_cannot_be_made_leaves_none_of_the_parents_made_for_it(tmp_path: Path) -> None:
    """Review 138 F2: a full disk at the root's last level left the parents made before it."""

    class _NoRoomForTheLastLevel(RealFileSystem):
        def makedirs(self, path: str) -> None:
            super().makedirs(os.path.dirname(path))
            raise OSError(errno.ENOSPC, "No space left on device", path)

    with pytest.raises(mqstore.StoreDiskFullError):
        mqstore.open(tmp_path / "p" / "x" / "y", fs=_NoRoomForTheLastLevel(), **SMALL)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []

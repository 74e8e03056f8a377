"""The queue ledger `<root>/queue_ledger.msgpack`: mqstore's own record of which ConsumeQueues
exist, how many units each had on disk and where its first file starts.

RocketMQ keeps no such record: a store opened after a queue's last file, its first file, or
a whole `consumequeue/<topic>/` directory was deleted starts that queue again from its
remaining units (or from a later min offset), and the acknowledged messages of the deleted
units can no longer be read by offset; after a deleted last file or directory the next put
even reuses queue offsets that records in the commitlog hold. With the ledger, recovery sees a
queue that is missing, shorter than it was, or starting later than the cleaner left it, and
rebuilds it from the commitlog, like a queue whose files were cut short. It also keeps, per
queue, the queue offsets handed out to records that were then lost (a lost commitlog tail that
`mqstore recover` accepted, a power loss that kept the queue's units and not the records): new
puts continue after them, as the commitlog's offsets do. And the floors of the queues
`clean_unused_topic` removed (LedgerFile.cleaned): their records below it are not dispatched
again after a crash (review 114 F1), until the log's head passes it.

Only the ConsumeQueues' owner writes it, and only when it changed: its recovery, before it
cuts units of records that were lost (their high water); then the ConsumeQueue actor at the
first tick after an open and after a queue is created, after each thorough flush (it counts
flushed units only), right after the cleaner deleted a queue's first files, before
`clean_unused_topic` deletes queues, and at close. Each write replaces the whole file atomically (write_atomic: temporary
file, fsync, rename). A store without the file (written by a broker, or by an older mqstore)
is not checked; an unreadable one is set aside as `.damaged`, logged, and not used. One a
newer mqstore wrote (a version above `_VERSION`) is refused (UnknownVersionError) and left in
place: opened without it, the queue offsets it reserves would be handed out again. No
RocketMQ version reads it.
"""

from __future__ import annotations

from typing import Final, Mapping, NamedTuple

from mqstore.log import get_logger
from mqstore.storage.codec import names_a_queue
from mqstore.storage.fs import FileSystem
from mqstore.storage.sealed import UnknownVersionError, seal, unseal

__all__ = [
    "LedgerEntry", "LedgerError", "LedgerFile", "load_ledger_file", "load_queue_ledger", "pack_queue_ledger",
    "peek_queue_ledger", "unpack_ledger_file", "unpack_queue_ledger", "write_queue_ledger",
]

_FORMAT: Final = "mqstore-queue-ledger"
# 2 added each queue's high water (version 1 files are read as having none); 3 the floors of
# queues `clean_unused_topic` removed, written only while there are any (a store that never
# cleaned a topic keeps a version 2 ledger, which the mqstore before this one reads).
_VERSION: Final = 3
_VERSION_WITHOUT_CLEANED: Final = 2

log = get_logger(__name__)

QueueKey = tuple[str, int]


class LedgerEntry(NamedTuple):
    """One queue: `units`, how many it had on disk (its queue offsets below this are written
    and flushed), `first`, the queue offset its first file starts at (the cleaner moves it
    up, and the ledger is written again right after), and `high_water`: queue offsets below
    it were handed out, though the queue may hold fewer units (their records were lost, and
    `mqstore recover` accepted it). No put is given one of them again: a consumer that had
    read them would skip the new message. 0 when it says no more than `units`."""

    units: int
    first: int
    high_water: int = 0

    @property
    def next_offset(self) -> int:
        """The lowest queue offset a new record of this queue may be given."""
        return max(self.units, self.high_water)


class LedgerError(ValueError):
    """The ledger's bytes are not a ledger this version can trust."""


class LedgerFile(NamedTuple):
    """What the ledger holds: `queues`, and `cleaned`: for each queue `clean_unused_topic`
    removed, the commitlog offset below which its records belong to the removed queue (every
    record of it was dispatched before the clean). Dispatch after a crash, which starts from
    a checkpoint older than the clean, must not build the removed queue again from them: a put
    after the clean was given its queue offsets anew from 0 (review 114 F1)."""

    queues: dict[QueueKey, LedgerEntry]
    cleaned: dict[QueueKey, int]


def pack_queue_ledger(entries: Mapping[QueueKey, LedgerEntry], cleaned: Mapping[QueueKey, int] | None = None) -> bytes:
    """The file's bytes for `entries` (and the cleaned queues' floors)."""
    queues = [[topic, queue_id, *entry] for (topic, queue_id), entry in sorted(entries.items())]
    if not cleaned:
        return seal(_FORMAT, _VERSION_WITHOUT_CLEANED, "queues", queues)
    floors = [[topic, queue_id, below] for (topic, queue_id), below in sorted(cleaned.items())]
    return seal(_FORMAT, _VERSION, "queues", {"queues": queues, "cleaned": floors})


def unpack_queue_ledger(data: bytes) -> dict[QueueKey, LedgerEntry]:
    """The ledger's queues in `data` (`unpack_ledger_file`)."""
    return unpack_ledger_file(data).queues


def unpack_ledger_file(data: bytes) -> LedgerFile:
    """The ledger in `data`; UnknownVersionError for a newer mqstore's; LedgerError for
    anything else, a flipped bit included."""
    version, content = unseal(data, _FORMAT, (1, 2, _VERSION), "queues", LedgerError)
    cleaned: dict[QueueKey, int] = {}
    if version >= 3:
        if not isinstance(content, dict) or set(content) != {"queues", "cleaned"} or not isinstance(content["cleaned"], list):
            raise LedgerError("bad version 3 ledger")
        for floor in content["cleaned"]:
            if not (isinstance(floor, list) and len(floor) == 3 and names_a_queue(floor[0], floor[1])
                    and type(floor[2]) is int and floor[2] >= 0):  # fmt: skip
                raise LedgerError(f"bad cleaned queue {floor!r}")
            cleaned[(floor[0], floor[1])] = floor[2]
        queues = content["queues"]
    else:
        queues = content
    entries: dict[QueueKey, LedgerEntry] = {}
    for entry in queues if isinstance(queues, list) else [None]:
        if not (isinstance(entry, list) and len(entry) == (4 if version == 1 else 5)):
            raise LedgerError(f"bad entry {entry!r}")
        topic, queue_id, units, first, high_water = entry if version != 1 else [*entry, 0]
        # The names become a path under consumequeue/ (reserved topics' queues included).
        if not names_a_queue(topic, queue_id):
            raise LedgerError(f"bad topic or queue id {entry!r}")
        if any(type(n) is not int or n < 0 for n in (units, first, high_water)):
            raise LedgerError(f"bad entry {entry!r}")
        entries[(topic, queue_id)] = LedgerEntry(units, first, high_water)
    return LedgerFile(entries, cleaned)


def load_queue_ledger(fs: FileSystem, path: str) -> dict[QueueKey, LedgerEntry] | None:
    """The ledger's queues at `path` (`load_ledger_file`)."""
    ledger = load_ledger_file(fs, path)
    return None if ledger is None else ledger.queues


def load_ledger_file(fs: FileSystem, path: str) -> LedgerFile | None:
    """The ledger at `path`, or None: no file (nothing to check against), or one that cannot
    be trusted (set aside as `.damaged` for a person to look at, and logged). A newer
    mqstore's raises UnknownVersionError naming it, and it stays where it is; one the process
    cannot read now (access, the disk) raises its OSError: the open refuses, as for an
    unreadable checkpoint (review 122 F4: taken for no ledger, the open went on without the
    floors of cleaned queues, served their old records at offsets acknowledged since, and
    wrote a ledger without them)."""
    if not fs.exists(path):
        return None
    data = fs.read_bytes(path)
    try:
        return unpack_ledger_file(data)
    except UnknownVersionError as exc:
        raise exc.at(path) from None
    except LedgerError as exc:
        kept = fs.set_aside(path, ".damaged")
        log.error("queue ledger unreadable: missing or cut-short consume queues cannot be detected at this open",
                  path=path, kept_as=kept, error=str(exc))  # fmt: skip
        return None


def peek_queue_ledger(fs: FileSystem, path: str, *, strict: bool = False) -> dict[QueueKey, LedgerEntry] | None:
    """`load_queue_ledger` for a read-only command: nothing set aside nor logged (None for no
    file, or one that cannot be read or trusted; `strict`: one that cannot be read now raises
    its OSError, as an answer built without it could be wrong). A newer mqstore's raises
    UnknownVersionError, as at an open: a command that went on without it would miss what it
    keeps and say nothing."""
    try:
        return unpack_queue_ledger(fs.read_bytes(path)) if fs.exists(path) else None
    except UnknownVersionError as exc:
        raise exc.at(path) from None
    except OSError as exc:
        if strict and not isinstance(exc, FileNotFoundError):
            raise  # a file there that this process may not read now: a command says so
        return None
    except LedgerError:
        return None


def write_queue_ledger(
    fs: FileSystem, path: str, entries: Mapping[QueueKey, LedgerEntry], *, cleaned: Mapping[QueueKey, int]
) -> None:
    """Replace the ledger atomically (OSError, e.g. a full disk, leaves the old one whole).
    `cleaned` is said by every writer: a write that left it out would forget the floors."""
    fs.write_atomic(path, pack_queue_ledger(entries, cleaned))

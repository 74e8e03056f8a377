"""Consumer offsets (`config/consumerOffset.json`) and RocketMQ's config-file protocol (§11.10).

RocketMQ writes these files with fastjson, whose output is not strict JSON: integer map keys
are bare (`{0:250,1:250}`). `load_fastjson` quotes them before `json.loads`; we write strict
JSON (quoted keys), which fastjson reads as well.

Persisting follows `MixAll.string2File`: the previous content goes to `<name>.bak`, the new
content to `<name>.tmp`, which is fsynced and renamed over `<name>`. Loading falls back to
`.bak` when the main file is missing, empty or unparsable; a stray `.tmp` is never read.
"""

from __future__ import annotations

import contextlib
import decimal
import hashlib
import json
import os
import re
from typing import Any, Callable, Container, Final, Literal, TypeAlias, TypeVar

from mqstore.log import get_logger
from mqstore.storage.codec import JAVA_INT_MAX, JAVA_INT_MIN, JAVA_LONG_MAX, JAVA_LONG_MIN, java_int, java_split
from mqstore.storage.fs import FileSystem

__all__ = [
    "CONSUMER_OFFSET_FILE",
    "DELAY_OFFSET_FILE",
    "ConfigFileError",
    "ConsumerOffsetStore",
    "load_config_file",
    "load_delay_offsets",
    "load_fastjson",
    "parse_delay_offset_table",
    "persist_config_file",
]

CONSUMER_OFFSET_FILE: Final = "consumerOffset.json"
DAMAGED_SUFFIX: Final = ".damaged"
DELAY_OFFSET_FILE: Final = "delayOffset.json"
TOPIC_GROUP_SEPARATOR: Final = "@"

log = get_logger(__name__)

T = TypeVar("T")


class ConfigFileError(ValueError):
    """Neither a config file nor its .bak could be read."""


# ---------------------------------------------------------------------------------------
# fastjson text


def _quote_bare_keys(text: str) -> str:
    """Quote bare integer object keys (`{0:1}` → `{"0":1}`), never touching string contents.

    A key position is right after `{` or `,` (whitespace aside); a bare token there that is
    followed by `:` is a key. Array elements are followed by `,` or `]`, so they are left alone.
    """
    out: list[str] = []
    i = 0
    n = len(text)
    expect_key = False  # just after `{` or `,`
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
            expect_key = False
            continue
        if c in "{,":
            expect_key = True
            out.append(c)
            i += 1
            continue
        if c in " \t\r\n":
            out.append(c)
            i += 1
            continue
        if expect_key and (c == "-" or c.isdigit()):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append('"')
                out.append(text[i:j])
                out.append('"')
                i = j
                expect_key = False
                continue
        expect_key = False
        out.append(c)
        i += 1
    return "".join(out)


def load_fastjson(text: str) -> Any:
    """Parse fastjson output (strict JSON, or with bare integer keys). Raises ValueError.
    Numbers with a fraction or an exponent are Decimals, exact as fastjson's BigDecimal."""
    return json.loads(_quote_bare_keys(text), parse_float=decimal.Decimal)


# ---------------------------------------------------------------------------------------
# The string2File / file2String protocol


def persist_config_file(fs: FileSystem, path: str, text: str, decode: Callable[[Any], object],
                        written: Container[bytes] = ()) -> bytes:  # fmt: skip
    """`MixAll.string2File`: previous content → `.bak`, new content → `.tmp`, fsync, rename.
    Returns the bytes written.

    Unlike RocketMQ, an empty previous file, or one that `decode` (the loader's own) cannot
    read, is not copied over a good `.bak`: it is kept as `.damaged` (valid JSON of the wrong
    shape went to `.bak` and the next write overwrote it: review 45 F1). A file whose bytes
    are in `written` (what this process wrote there itself: digests, `written_digest`) is known
    to read, and not parsed again (review 84 F4: two parses of a 4 MB table per persist).
    Raises OSError on I/O errors (the previous file is then still intact)."""
    fs.makedirs(os.path.dirname(path))
    if fs.exists(path):
        previous = fs.read_bytes(path)
        if previous.strip() and (written_digest(previous) in written or _decodes(previous, decode)):
            backup = path + ".bak"
            if fs.exists(backup):
                # An unreadable `.bak` may hold the only copy of what a load salvaged from it
                # (review 54 H1: rotated out at the second write, every group's offsets were
                # gone from the disk): kept aside, never overwritten.
                old_backup = fs.read_bytes(backup)
                if old_backup.strip() and written_digest(old_backup) not in written and not _decodes(old_backup, decode):
                    _set_aside_a_copy(fs, backup, old_backup)
            fs.write_atomic(backup, previous)
        elif previous.strip():
            _set_aside_a_copy(fs, path, previous)
    data = text.encode("utf-8")
    fs.write_atomic(path, data)  # writes <path>.tmp, fsyncs, renames, fsyncs dir
    return data


def written_digest(data: bytes) -> bytes:
    """What `persist_config_file` compares files with (the writer keeps its last writes')."""
    return hashlib.blake2b(data, digest_size=16).digest()


MAX_DAMAGED_COPIES = 16


def _set_aside_a_copy(fs: FileSystem, path: str, damaged: bytes) -> None:
    """Keep an unreadable version for a person to look at, never over another one: `.damaged`,
    then `.damaged.1`, ...; bytes already kept are not kept twice, and at most
    MAX_DAMAGED_COPIES (a file that keeps being damaged fills no disk)."""
    names = [path + DAMAGED_SUFFIX] + [f"{path}{DAMAGED_SUFFIX}.{n}" for n in range(1, MAX_DAMAGED_COPIES)]
    for name in names:
        if not fs.exists(name):
            try:
                fs.write_atomic(name, damaged)
            except OSError as exc:  # the copy is for a person; the offsets are written all the same
                log.error("config_file_not_set_aside", path=path, damaged=name, error=str(exc))
                return
            log.error("config_file_set_aside", path=path, damaged=name)
            return
        if not fs.isfile(name):
            continue  # not ours to read (a directory, a FIFO): the next name
        if fs.read_bytes(name) == damaged:
            return
    log.error("config_file_not_set_aside", path=path, reason=f"{MAX_DAMAGED_COPIES} damaged copies kept already")


_DECODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)  # deep nesting: RecursionError


def _decodes(data: bytes, decode: Callable[[Any], object]) -> bool:
    try:
        decode(load_fastjson(data.decode("utf-8")))
    except _DECODE_ERRORS:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return True


def load_config_file(fs: FileSystem, path: str, decode: Callable[[Any], T], *, read_from: list[str] | None = None) -> T | None:
    """Read `path` (fallback `path.bak`) and `decode` its parsed JSON; the file it came from is
    appended to `read_from`.

    None if neither file exists. Raises ConfigFileError if what exists cannot be decoded."""
    errors: list[str] = []
    any_exists = False
    for candidate in (path, path + ".bak"):
        if not fs.exists(candidate):
            continue
        any_exists = True
        try:
            text = fs.read_bytes(candidate).decode("utf-8")
            if not text.strip():
                errors.append(f"{candidate}: empty")
                continue
            value = decode(load_fastjson(text))
        except _DECODE_ERRORS as e:
            errors.append(f"{candidate}: {e}")
            continue
        if candidate != path:
            log.warning("config_file_loaded_from_bak", path=candidate, errors=errors)
        if read_from is not None:
            read_from.append(candidate)
        return value
    if not any_exists:
        return None
    raise ConfigFileError("cannot load " + path + ": " + "; ".join(errors))


def _int_table(obj: Any, owner: str = "", left_out: list[str] | None = None) -> dict[int, int]:
    """An object of `{int key: long}`. An entry whose key is no Java int or whose value is no
    Java long is left out, said (and named in `left_out`), the rest read: refusing the file
    served every group from the older `.bak`, written back at the next persist (review 111
    F3, 112 O1 for the key, 114 F4 for the value). An `obj` of another shape raises."""
    if not isinstance(obj, dict):
        raise TypeError(f"expected an object, got {type(obj).__name__}")
    table: dict[int, int] = {}
    for key, value in obj.items():
        try:
            table[_queue_id(key)] = _as_int(value)
        except (ValueError, TypeError) as exc:
            log.error("consumer_offsets_entry_left_out", owner=owner, queue_id=repr(key)[:80], offset=repr(value)[:80],
                      reason=str(exc)[:200])  # fmt: skip
            if left_out is not None:
                left_out.append(f"{owner}/{key}"[:200])
    return table


def _queue_id(k: Any) -> int:
    """A table's key as the broker's Integer holds it (Integer.parseInt: ASCII digits, a
    sign): one outside a Java int was served and written back where a broker cannot read it
    (review 108 F5); Python's int() read "1_0" as 10 and " 4" as 4, written back as other
    keys (review 114 F5)."""
    if type(k) is int:
        queue_id = k
    elif type(k) is str and _QUEUE_ID.fullmatch(k):
        queue_id = int(k)
    else:
        raise ValueError(f"queue id {k!r} is not an integer")
    if not JAVA_INT_MIN <= queue_id <= JAVA_INT_MAX:
        raise ValueError(f"queue id {queue_id} is outside a Java int")
    return queue_id


def _as_int(v: Any) -> int:
    # A string of digits is a number to fastjson (TypeUtils.castToLong: Long.parseLong), so
    # the broker reads {"0":"450"} as offset 450; so do we.
    if type(v) is str and _DIGITS.fullmatch(v) and JAVA_LONG_MIN <= int(v) <= JAVA_LONG_MAX:
        return int(v)
    # So is a whole number written with a fraction or an exponent (200.0, 2e2: castToLong of
    # its BigDecimal), read exactly (review 108 F5, 111 F5).
    if type(v) is decimal.Decimal and v.is_finite() and v == v.to_integral_value() and JAVA_LONG_MIN <= v <= JAVA_LONG_MAX:
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    if not JAVA_LONG_MIN <= v <= JAVA_LONG_MAX:  # what a broker could not read back (review 47 F4)
        raise ValueError(f"{v} is outside a Java long")
    return v


_DIGITS = re.compile(r"-?[0-9]{1,19}")
_QUEUE_ID = re.compile(r"[+-]?[0-9]+")


def parse_delay_offset_table(doc: Any) -> dict[int, int]:
    """`{"offsetTable":{<delayLevel>:<offset>}}` → {level: offset}."""
    return _int_table(doc.get("offsetTable", {}))


def load_delay_offsets(fs: FileSystem, root_dir: str) -> dict[int, int] | None:
    """`config/delayOffset.json` of a store root (None if absent). Raises ConfigFileError."""
    return load_config_file(fs, os.path.join(root_dir, "config", DELAY_OFFSET_FILE), parse_delay_offset_table)


# ---------------------------------------------------------------------------------------
# ConsumerOffsetStore

# What an open found of the committed offsets: "file" (read whole), "backup" (the file did not
# read, its `.bak` did: offsets up to one persist interval older), "partly" (neither read whole:
# the entries that did are served, the rest read -1), "unreadable" (nothing read: every group
# reads -1, as if it never committed), "none" (no file: a new store).
OffsetsLoaded: TypeAlias = Literal["file", "backup", "partly", "unreadable", "none"]


def _parse_offset_table(doc: Any, left_out: list[str] | None = None) -> dict[str, dict[int, int]]:
    table = doc["offsetTable"]
    if not isinstance(table, dict):
        raise TypeError("offsetTable is not an object")
    parsed: dict[str, dict[int, int]] = {}
    for key, queues in table.items():
        entries = _int_table(queues, str(key), left_out)
        if entries or not queues:  # (a group whose every entry was left out is none)
            parsed[str(key)] = entries
    return parsed


def _whole_offset_table(doc: Any) -> dict[str, dict[int, int]]:
    """`_parse_offset_table` refusing a file with any entry left out: what a persist asks of
    the file it would rotate to `.bak`. Such a file is served what reads at the open, but its
    bytes are set aside (`.damaged`) rather than rotated away: the entry is for a person."""
    left_out: list[str] = []
    table = _parse_offset_table(doc, left_out)
    if left_out:
        raise ValueError(f"entries that are not a Java int queue id with a Java long offset: {left_out[:5]}")
    return table


# One `queue:offset` pair of a group (fastjson writes the queue ids bare, other writers
# quoted), the start of the offsetTable member, and what follows a group's name: for a file
# cut short.
# JSON's whitespace only: Python's \s also takes 0x1c-0x1f, 0x0b and 0x0c, and a run of such
# damage between a group's pairs was read as a pair's separator (review 127 F6).
_PAIR = re.compile(r'"?(-?\d+)"?[ \t\n\r]*:[ \t\n\r]*(-?\d+)[ \t\n\r]*([,}]|\Z)')
_OFFSET_TABLE = re.compile(r'"offsetTable"[ \t\n\r]*:[ \t\n\r]*\{')
_BETWEEN_GROUPS = re.compile(r"[ \t\n\r,]*")
_GROUP_OPENS = re.compile(r"[ \t\n\r]*:[ \t\n\r]*\{")
# json's own string scanner, in C (a JSON string from just past its opening quote: its value
# and the index past its closing quote; ValueError if it does not end); typeshed leaves it out.
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _salvage_cut_short(text: str) -> tuple[dict[str, dict[int, int]], list[str]] | None:
    """The whole `queue:offset` pairs of the offsetTable of a file cut short (a write that did
    not reach the disk whole): a number that runs to the end of the text may be cut, so it is
    left out. Only that member's groups (review 111 F2: a RocketMQ 5.x file's pullOffsetTable
    and resetOffsetTable groups, pulled and pending offsets, were served as committed), read
    in one pass, each name a JSON string (escapes and braces allowed: review 108 F4; a regex
    over them took quadratic time on a name of quotes cut short: review 111 F4)."""
    found = _OFFSET_TABLE.search(text)
    if found is None:
        return None
    kept: dict[str, dict[int, int]] = {}
    at, end = found.end(), len(text)
    while True:
        at = _BETWEEN_GROUPS.match(text, at).end()  # type: ignore[union-attr]  # (matches the empty string)
        if at >= end or text[at] != '"':
            break  # the table's end, or the cut
        try:
            name, at = _scanstring(text, at + 1)
        except ValueError:
            break  # cut inside the name
        opens = _GROUP_OPENS.match(text, at)
        if opens is None:
            break
        # The group's pairs one after the other, up to its `}`. Anything else (zeros of a torn
        # page, a `{`) ends the salvage there: review 125 F1 took every pair up to the next `}`
        # in the text, past zeroed bytes into the next group's, and served them as this one's.
        entries: dict[int, int] = {}
        at, closed = opens.end(), False
        while True:
            at = _BETWEEN_GROUPS.match(text, at).end()  # type: ignore[union-attr]
            if at < end and text[at] == "}":
                at, closed = at + 1, True
                break
            pair = _PAIR.match(text, at)
            if pair is None or not pair.group(3):
                break  # damage, or the cut (a number that runs to the end may be cut)
            with contextlib.suppress(ValueError, TypeError):
                entries[_queue_id(pair.group(1))] = _as_int(int(pair.group(2)))
            at = pair.end()
            if pair.group(3) == "}":
                closed = True
                break
        if entries and TOPIC_GROUP_SEPARATOR in name:
            kept[name] = entries
        if not closed:
            break
    return (kept, ["(the rest of a file cut short)"]) if kept else None


def _salvage_offset_table(fs: FileSystem, path: str) -> tuple[dict[str, dict[int, int]], list[str]] | None:
    """The entries of `path` that decode, and what was left out: for a file that is JSON in
    RocketMQ's shape with some entries of the wrong type, or cut short. None if even that
    shape is not there."""
    try:
        text = fs.read_bytes(path).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    try:
        table = load_fastjson(text)["offsetTable"]
    except _DECODE_ERRORS:
        return _salvage_cut_short(text)
    if not isinstance(table, dict):
        return None
    kept: dict[str, dict[int, int]] = {}
    left_out: list[str] = []
    for topic_at_group, queues in table.items():
        if not isinstance(queues, dict):
            left_out.append(str(topic_at_group))
            continue
        entries = _int_table(queues, str(topic_at_group), left_out)
        if entries:
            kept[str(topic_at_group)] = entries
    return kept, left_out


_KEY_DECODER = json.JSONDecoder()


_STRUCTURE = re.compile(r'["{}\[\],]')  # what _value_end looks at: the rest is skipped in C
_STRING_END = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)


def _value_end(text: str, i: int) -> int:
    """Where the JSON (or fastjson) value starting at `i` ends: at the `,` or `}` that closes
    it at its own depth (strings skipped whole)."""
    depth = 0
    find_structure, find_string_end = _STRUCTURE.search, _STRING_END.match
    while (m := find_structure(text, i)) is not None:
        c = m.group()
        i = m.end()
        if c == '"':
            closing = find_string_end(text, i)
            if closing is None:
                break
            i = closing.end()
        elif c in "{[":
            depth += 1
        elif c in "}]":
            if depth == 0:
                return m.start()
            depth -= 1
        elif depth == 0:  # ","
            return m.start()
    raise ValueError("a value runs to the end of the text")


def _top_level_members(text: str) -> list[tuple[str, str]]:
    """The top-level `key: value` pairs of a document, each value as the exact text it has in
    the file (fastjson's bare integer keys inside it kept). Raises ValueError."""
    i = text.index("{") + 1
    members: list[tuple[str, str]] = []
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "}":
            return members
        if text[i] != '"':
            raise ValueError(f"a top-level key that is not a string at {i}")
        key, i = _KEY_DECODER.raw_decode(text, i)
        i = text.index(":", i) + 1
        j = _value_end(text, i)
        members.append((key, text[i:j].strip()))
        i = j


def _foreign_members(text: str) -> list[tuple[str, str | None]]:
    """The document's top-level keys in their order, with the exact text of each value but
    offsetTable's (None: mqstore's to write). Raises ValueError, TypeError, KeyError."""
    doc = load_fastjson(text)
    _parse_offset_table(doc)
    if list(doc) == ["offsetTable"]:  # 4.x's and mqstore's own: nothing else to keep, no scan (review 64 F6)
        return [("offsetTable", None)]
    members = _top_level_members(text)
    if [key for key, _ in members] != list(doc):  # the scan and the parser must agree, or nothing is kept raw
        raise ValueError("top-level keys not scanned as parsed")
    return [(key, None if key == "offsetTable" else value) for key, value in members]


def _json_text(value: Any, **options: Any) -> str:
    """JSON text of `value`, names in UTF-8 as fastjson writes them; a name holding a lone
    surrogate (read from a `\\ud800` escape) is written escaped, as it was read: in UTF-8 it
    failed every later write of the table (review 114 F2)."""
    text = json.dumps(value, ensure_ascii=False, **options)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(value, ensure_ascii=True, **options)
    return text


# The table (`topic@group` -> queue id -> offset) and the file's top-level members, copied.
OffsetsSnapshot: TypeAlias = tuple[dict[str, dict[int, int]], list[tuple[str, str | None]]]


class ConsumerOffsetStore:
    """Committed consume offsets per (group, topic, queue id), like the broker's
    ConsumerOffsetManager. Keys are RocketMQ's `topic@group`. Not thread-safe.

    Only `offsetTable` is mqstore's: the file's other top-level keys (RocketMQ 5.x's
    `dataVersion`, `pullOffsetTable`, `resetOffsetTable`, ...) are written back as the exact
    text they had, in their order (review 61 H4: they were dropped at the first persist). A
    pending `resetOffsetTable` entry (an admin's reset no consumer has pulled since) is kept,
    not applied: mqstore serves offsetTable, as a 4.x broker does, and a 5.x broker reopening
    the directory applies the reset at the group's next pull, as it would have."""

    def __init__(self, fs: FileSystem, root_dir: str) -> None:
        self._fs = fs
        self.path = os.path.join(root_dir, "config", CONSUMER_OFFSET_FILE)
        self._table: dict[str, dict[int, int]] = {}
        # The loaded document's top-level members: (key, exact value text), None for offsetTable.
        self._members: list[tuple[str, str | None]] = [("offsetTable", None)]
        self._written: tuple[bytes, ...] = ()  # digests of this process's last two writes
        # What the last load found (OffsetsLoaded): "none" when nothing was loaded yet.
        self.loaded: OffsetsLoaded = "none"

    def _load_foreign_members(self) -> None:
        """The members of the file the table was read from (the file's, else the `.bak`'s)."""
        for candidate in (self.path, self.path + ".bak"):
            try:
                text = self._fs.read_bytes(candidate).decode("utf-8") if self._fs.exists(candidate) else ""
                self._members = _foreign_members(text)
            except (OSError, *_DECODE_ERRORS):
                continue
            pending = [key for key, value in self._members if key == "resetOffsetTable" and value not in (None, "{}")]
            if pending:
                log.warning("consumer_offsets_reset_pending", path=candidate,
                            detail="a RocketMQ 5.x admin reset no consumer has pulled yet: kept, not applied")  # fmt: skip
            return

    @staticmethod
    def _key(group: str, topic: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def load(self) -> bool:
        """Read the file (fallback .bak). False if neither exists or neither parses (an empty
        table, with an error naming the file: consumers restart from their own reset policy,
        as after a lost file, rather than the store refusing to open; the unreadable file is
        kept as `.damaged` on the next persist)."""
        left_out: list[str] = []

        def parse(doc: Any) -> dict[str, dict[int, int]]:
            left_out.clear()  # (of this file alone: the `.bak` is read after a file that failed)
            return _parse_offset_table(doc, left_out)

        try:
            read_from: list[str] = []
            table = load_config_file(self._fs, self.path, parse, read_from=read_from)
            self.loaded = "none" if table is None else "partly" if left_out else \
                "file" if read_from == [self.path] else "backup"  # fmt: skip
        except ConfigFileError as exc:
            log.error("consumer_offsets_unreadable", path=self.path, error=str(exc)[:500])
            table = None
            # Neither file reads whole: the entries that do are served, rather than every group
            # starting over; the file's over the backup's, which is older (review 54 H1: only the
            # file was read). Both are kept aside at the next write (persist_config_file).
            table, left_out = {}, []
            for candidate in (self.path + ".bak", self.path):
                salvaged = _salvage_offset_table(self._fs, candidate) if self._fs.exists(candidate) else None
                if salvaged is not None:
                    for key, entries in salvaged[0].items():
                        table.setdefault(key, {}).update(entries)
                    left_out += [f"{os.path.basename(candidate)}: {what}" for what in salvaged[1]]
            if table:
                log.error("consumer_offsets_partly_read", path=self.path, kept=len(table), left_out=left_out[:20])
                self.loaded = "partly"
            else:
                table = None
                self.loaded = "unreadable"
        self._members = [("offsetTable", None)]
        if table is None:
            self._table = {}
            return False
        self._table = table
        self._load_foreign_members()
        return True

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        # Programming errors, refused before anything is kept: the file is read by Java, whose
        # queue ids are ints and offsets longs (2**70 would be persisted and unreadable there).
        for name, text in (("group", group), ("topic", topic)):
            if type(text) is not str:
                raise TypeError(f"{name} must be a str, not {type(text).__name__}")
            if not text or TOPIC_GROUP_SEPARATOR in text:
                raise ValueError(f"{name} {text!r} must be non-empty and without {TOPIC_GROUP_SEPARATOR!r}")
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # kept, it would fail every later write of the whole table
                    raise ValueError(f"{name} {text!r} cannot be written as UTF-8 (a lone surrogate)") from None
        java_int("queue_id", queue_id, 0, JAVA_INT_MAX)
        java_int("offset", offset, 0, JAVA_LONG_MAX)
        queues = self._table.setdefault(self._key(group, topic), {})
        previous = queues.get(queue_id)
        if previous is not None and offset < previous:
            # RocketMQ accepts it (a consumer may reset backwards) and only logs.
            log.info("consumer_offset_moved_back", group=group, topic=topic, queue_id=queue_id,
                     previous=previous, offset=offset)
        queues[queue_id] = offset

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 if none (RocketMQ's convention)."""
        return self._table.get(self._key(group, topic), {}).get(queue_id, -1)

    def query_all(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(self._key(group, topic), {}))

    def table(self) -> dict[str, dict[int, int]]:
        """A copy of the whole table, keyed `topic@group`."""
        return {k: dict(v) for k, v in self._table.items()}

    def groups_of_topic(self, topic: str) -> list[str]:
        out = []
        for key in self._table:
            parts = java_split(key, TOPIC_GROUP_SEPARATOR)
            if len(parts) == 2 and parts[0] == topic:
                out.append(parts[1])
        return out

    def encode(self, snapshot: OffsetsSnapshot | None = None) -> str:
        """RocketMQ's shape, tab-indented like fastjson's pretty format: offsetTable as strict
        JSON, the loaded file's other top-level members as the exact text they had. Of
        `snapshot` (`snapshot()`) when given, else of the table now."""
        table_now, members_now = snapshot if snapshot is not None else (self._table, self._members)
        table = {key: {str(q): off for q, off in sorted(queues.items())} for key, queues in sorted(table_now.items())}
        ours = _json_text(table, indent="\t", separators=(",", ":")).replace("\n", "\n\t")
        members = [f"{_json_text(key)}:{ours if value is None else value}" for key, value in members_now]
        return "{\n\t" + ",\n\t".join(members) + "\n}"

    def snapshot(self) -> OffsetsSnapshot:
        """The table and the file's other members as they are now (copies: for `persist`
        outside the lock that commits take; review 84 F4)."""
        return {key: dict(queues) for key, queues in self._table.items()}, list(self._members)

    def persist(self, snapshot: OffsetsSnapshot | None = None) -> None:
        """Write the table (or `snapshot`) with the string2File protocol. Raises OSError on I/O
        errors. One persist at a time (the caller's lock); not concurrent with `load`."""
        data = persist_config_file(self._fs, self.path, self.encode(snapshot), _whole_offset_table, self._written)
        # The file now, and the `.bak` the next write finds: known to read, not parsed again.
        self._written = (self._written[-1:] if self._written else ()) + (written_digest(data),)

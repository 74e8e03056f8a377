"""What Python users pick today, each driven as its authors intend, behind the harness's
System protocol: SQLite WAL, LMDB, persist-queue, Redis Streams and a plain-mmap floor.

Durability classes (compared only within a class):
  async  the OS may lose the last second on power loss
  sync   acknowledged means on disk: one commit per message
"""

from __future__ import annotations

import mmap
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mqstore.bench.harness import NotSupported
from mqstore.bench.workload import BATCH_SIZE_MSGS, BenchMessage

REDIS_START_TIMEOUT_S = 10.0
REDIS_STOP_TIMEOUT_S = 10.0


def run_threads(work: Sequence[Sequence[BenchMessage]], fn: Callable[[int, BenchMessage], None]) -> int:
    """Runs fn(thread_index, message) for each thread's list in its own thread; re-raises."""
    errors: list[BaseException] = []

    def body(t: int) -> None:
        try:
            for m in work[t]:
                fn(t, m)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,), name=f"bench-prod-{t}") for t in range(len(work))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return len(threads)


def _timed_each(keys: Sequence[str], fn: Callable[[str], object]) -> list[float]:
    lat: list[float] = []
    for k in keys:
        start = time.perf_counter()
        if not fn(k):
            raise LookupError(f"key {k!r} not found")
        lat.append(time.perf_counter() - start)
    return lat


# ------------------------------------------------------------------ SQLite (stdlib)

_SQLITE_SCHEMA = (
    "CREATE TABLE msg (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, queue_id INTEGER NOT NULL,"
    " tag TEXT, key TEXT, body BLOB NOT NULL, store_ms INTEGER NOT NULL)",
    "CREATE INDEX msg_tq ON msg (topic, queue_id, id)",
    "CREATE INDEX msg_key ON msg (key)",
)
_SQLITE_INSERT = "INSERT INTO msg (topic, queue_id, tag, key, body, store_ms) VALUES (?, ?, ?, ?, ?, ?)"


def _sqlite_connect(db: Path, synchronous: str) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, or autocommit per statement.
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False, timeout=60.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


class SqliteAsync:
    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.db = path / "bench.db"
        self.conn = _sqlite_connect(self.db, "NORMAL")
        for stmt in _SQLITE_SCHEMA:
            self.conn.execute(stmt)

    def append(self, batches: Sequence[Sequence[BenchMessage]]) -> None:
        c = self.conn
        for batch in batches:
            now_ms = time.time_ns() // 1_000_000
            c.execute("BEGIN")
            c.executemany(_SQLITE_INSERT, [(m.topic, m.queue_id, m.tag, m.key, m.body, now_ms) for m in batch])
            c.execute("COMMIT")

    def settle(self, per_queue: dict[tuple[str, int], int]) -> None:
        pass

    def read_all(self, per_queue: dict[tuple[str, int], int]) -> int:
        read = 0
        for topic, queue_id in per_queue:
            last = -1
            while True:
                rows = self.conn.execute(
                    "SELECT id, tag, key, body FROM msg WHERE topic = ? AND queue_id = ? AND id > ?"
                    " ORDER BY id LIMIT ?",
                    (topic, queue_id, last, BATCH_SIZE_MSGS),
                ).fetchall()
                if not rows:
                    break
                read += len(rows)
                last = rows[-1][0]
        return read

    def lookup(self, keys: Sequence[str]) -> list[float]:
        q = "SELECT id, topic, queue_id, tag, body FROM msg WHERE key = ?"
        return _timed_each(keys, lambda k: self.conn.execute(q, (k,)).fetchall())

    def put_each(self, per_thread: Sequence[Sequence[BenchMessage]]) -> None:
        # As SqliteSync, at synchronous=NORMAL: a connection per thread, writes queued on a
        # Python lock (SQLite has one writer), one autocommitted INSERT per message.
        conns = [_sqlite_connect(self.db, "NORMAL") for _ in per_thread]
        lock = threading.Lock()

        def put(t: int, m: BenchMessage) -> None:
            with lock:
                conns[t].execute(_SQLITE_INSERT, (m.topic, m.queue_id, m.tag, m.key, m.body, time.time_ns() // 1_000_000))

        try:
            run_threads(per_thread, put)
        finally:
            for c in conns:
                c.close()

    def put_pipelined(self, messages: Sequence[BenchMessage], window: int) -> None:
        raise NotSupported("sqlite3: no pipelined single-message API (each call blocks until done); its batched commits are the append case")

    def close(self) -> None:
        self.conn.close()


class SqliteSync:
    """synchronous=FULL, one autocommitted INSERT per message, 16 threads with a connection each.

    SQLite has one writer; a Python lock queues the threads instead of SQLite's busy handler,
    whose sleeps (up to 100 ms) would measure the handler rather than the commit.
    """

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.db = path / "bench.db"
        setup = _sqlite_connect(self.db, "FULL")
        for stmt in _SQLITE_SCHEMA:
            setup.execute(stmt)
        setup.close()
        self.lock = threading.Lock()

    def append_sync(self, per_thread: Sequence[Sequence[BenchMessage]]) -> int:
        conns = [_sqlite_connect(self.db, "FULL") for _ in per_thread]

        def put(t: int, m: BenchMessage) -> None:
            with self.lock:
                conns[t].execute(_SQLITE_INSERT, (m.topic, m.queue_id, m.tag, m.key, m.body, time.time_ns() // 1_000_000))

        try:
            return run_threads(per_thread, put)
        finally:
            for c in conns:
                c.close()

    def close(self) -> None:
        pass


class SqliteSystem:
    name = "sqlite"
    required = False

    def __init__(self) -> None:
        self.notes = {
            "schema": "WAL; index on (topic, queue_id, id) and on key; append = one transaction per batch of 32",
            "sync": "synchronous=FULL, one autocommit INSERT per message from 16 threads (own connection each, writes queued on a Python lock)",
            "put_each": "synchronous=NORMAL, one autocommit INSERT per message from 4 or 16 threads (own connection each, writes queued on a Python lock); no pipelined API",
        }

    def unavailable_reason(self) -> str | None:
        return None

    def durability(self) -> dict[str, str]:
        return {"async": "journal_mode=WAL, synchronous=NORMAL", "sync": "journal_mode=WAL, synchronous=FULL"}

    def versions(self) -> dict[str, str]:
        return {"sqlite": sqlite3.sqlite_version}

    def open_async(self, path: Path, size_hint_bytes: int) -> SqliteAsync:
        return SqliteAsync(path)

    def open_sync(self, path: Path, size_hint_bytes: int) -> SqliteSync:
        return SqliteSync(path)


# ------------------------------------------------------------------ LMDB

_LMDB_VAL = struct.Struct(">BH")  # tag length, key length; then tag, key, body


def _lmdb_log_key(topic: bytes, queue_id: int, seq: int) -> bytes:
    return topic + b"\x00" + struct.pack(">IQ", queue_id, seq)


class LmdbStore:
    def __init__(self, path: Path, size_hint_bytes: int, sync: bool) -> None:
        import lmdb

        path.mkdir(parents=True, exist_ok=True)
        # The map is sparse: reserve generously so a run never hits MapFullError.
        self.env = lmdb.open(
            str(path), map_size=max(1 << 30, size_hint_bytes * 4), max_dbs=2,
            sync=sync, metasync=sync, lock=True,
        )
        self.log = self.env.open_db(b"log")
        self.keys = self.env.open_db(b"keys")
        self.next_seq: dict[tuple[str, int], int] = {}

    def _put(self, txn: Any, m: BenchMessage) -> None:
        # Called inside a write transaction: LMDB's single writer serialises next_seq too.
        q = (m.topic, m.queue_id)
        seq = self.next_seq.get(q, 0)
        self.next_seq[q] = seq + 1
        lk = _lmdb_log_key(m.topic.encode(), m.queue_id, seq)
        tag, key = m.tag.encode(), m.key.encode()
        txn.put(lk, _LMDB_VAL.pack(len(tag), len(key)) + tag + key + m.body, db=self.log)
        txn.put(key, lk, db=self.keys)

    def append(self, batches: Sequence[Sequence[BenchMessage]]) -> None:
        for batch in batches:
            with self.env.begin(write=True) as txn:
                for m in batch:
                    self._put(txn, m)

    def settle(self, per_queue: dict[tuple[str, int], int]) -> None:
        pass

    def read_all(self, per_queue: dict[tuple[str, int], int]) -> int:
        read = 0
        for topic, queue_id in per_queue:
            prefix = topic.encode() + b"\x00" + struct.pack(">I", queue_id)
            seq = 0
            while True:
                got = 0
                with self.env.begin(db=self.log) as txn:  # one read transaction per batch, like a poll
                    cur = txn.cursor()
                    if cur.set_range(prefix + struct.pack(">Q", seq)):
                        for k, v in cur:
                            if not k.startswith(prefix) or got == BATCH_SIZE_MSGS:
                                break
                            tl, kl = _LMDB_VAL.unpack_from(v)
                            _body = v[_LMDB_VAL.size + tl + kl :]
                            got += 1
                            seq = struct.unpack_from(">Q", k, len(prefix))[0] + 1
                if got == 0:
                    break
                read += got
        return read

    def lookup(self, keys: Sequence[str]) -> list[float]:
        def one(k: str) -> object:
            with self.env.begin() as txn:
                lk = txn.get(k.encode(), db=self.keys)
                return None if lk is None else txn.get(lk, db=self.log)

        return _timed_each(keys, one)

    def append_sync(self, per_thread: Sequence[Sequence[BenchMessage]]) -> int:
        def put(t: int, m: BenchMessage) -> None:
            with self.env.begin(write=True) as txn:
                self._put(txn, m)

        return run_threads(per_thread, put)

    def put_each(self, per_thread: Sequence[Sequence[BenchMessage]]) -> None:
        self.append_sync(per_thread)  # one write txn per message; sync as this env was opened

    def put_pipelined(self, messages: Sequence[BenchMessage], window: int) -> None:
        raise NotSupported("py-lmdb: no pipelined single-message API (each call blocks until done); its batched commits are the append case")

    def close(self) -> None:
        self.env.close()


class LmdbSystem:
    name = "lmdb"
    required = False

    def __init__(self) -> None:
        self.notes = {
            "schema": "sub-db 'log' keyed topic\\0 + (queue, seq) big-endian; sub-db 'keys' key -> log key; one write txn per batch of 32",
            "sync": "sync=True, metasync=True, one write txn per message from 16 threads (LMDB serialises writers)",
            "put_each": "sync=False, one write txn per message from 4 or 16 threads; no pipelined API",
        }

    def unavailable_reason(self) -> str | None:
        try:
            import lmdb  # noqa: F401
        except ImportError as e:
            return f"python lmdb not importable: {e}"
        return None

    def durability(self) -> dict[str, str]:
        return {"async": "sync=False, metasync=False", "sync": "sync=True, metasync=True"}

    def versions(self) -> dict[str, str]:
        import lmdb

        return {"py-lmdb": lmdb.__version__, "liblmdb": ".".join(map(str, lmdb.version()))}

    def open_async(self, path: Path, size_hint_bytes: int) -> LmdbStore:
        return LmdbStore(path, size_hint_bytes, sync=False)

    def open_sync(self, path: Path, size_hint_bytes: int) -> LmdbStore:
        return LmdbStore(path, size_hint_bytes, sync=True)


# ------------------------------------------------------------------ persist-queue


class PersistQueueStore:
    """persistqueue.SQLiteQueue: one FIFO, one put per message (no batch API), pickled items."""

    def __init__(self, path: Path, synchronous: str) -> None:
        import persistqueue

        self.q = persistqueue.SQLiteQueue(str(path), multithreading=True, auto_commit=True)
        # persist-queue has no durability knob; its connections are private attributes.
        for conn in {id(self.q._putter): self.q._putter, id(self.q._getter): self.q._getter}.values():
            if conn is None:
                raise RuntimeError("persist-queue opened no SQLite connection (its private attributes changed?)")
            conn.execute(f"PRAGMA synchronous={synchronous}")

    def append(self, batches: Sequence[Sequence[BenchMessage]]) -> None:
        put = self.q.put
        for batch in batches:
            for m in batch:
                put(tuple(m))

    def settle(self, per_queue: dict[tuple[str, int], int]) -> None:
        pass

    def read_all(self, per_queue: dict[tuple[str, int], int]) -> int:
        # A consuming get: each read deletes its row (a write), and the queue is then empty.
        total = sum(per_queue.values())
        get = self.q.get
        for _ in range(total):
            get(block=False)
        return total

    def lookup(self, keys: Sequence[str]) -> list[float]:
        raise NotSupported("persist-queue has no lookup by key")

    def append_sync(self, per_thread: Sequence[Sequence[BenchMessage]]) -> int:
        def put(_t: int, m: BenchMessage) -> None:
            self.q.put(tuple(m))

        return run_threads(per_thread, put)

    def put_each(self, per_thread: Sequence[Sequence[BenchMessage]]) -> None:
        self.append_sync(per_thread)  # a commit per put; synchronous as this queue was opened

    def put_pipelined(self, messages: Sequence[BenchMessage], window: int) -> None:
        raise NotSupported("persist-queue: no pipelined single-message API (each call blocks until done); its batched commits are the append case")

    def close(self) -> None:
        self.q.close()


class PersistQueueSystem:
    name = "persistqueue"
    required = False

    def __init__(self) -> None:
        self.notes = {
            "api": "SQLiteQueue (WAL, auto_commit=True): one put per message, no batch API; read is a consuming get() (deletes the row); no key lookup; one FIFO, no topic/queue",
            "durability": "synchronous set through its private _putter/_getter connections (it has no option)",
            "sync": "16 threads share the queue (multithreading=True; it serialises on its own lock)",
            "put_each": "synchronous=NORMAL, one put per message from 4 or 16 threads sharing the queue; no pipelined API",
        }

    def unavailable_reason(self) -> str | None:
        try:
            import persistqueue  # noqa: F401
        except ImportError as e:
            return f"persist-queue not importable: {e}"
        return None

    def durability(self) -> dict[str, str]:
        return {"async": "SQLiteQueue, WAL, synchronous=NORMAL", "sync": "SQLiteQueue, WAL, synchronous=FULL, commit per put"}

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        return {"persist-queue": version("persist-queue")}

    def open_async(self, path: Path, size_hint_bytes: int) -> PersistQueueStore:
        return PersistQueueStore(path, "NORMAL")

    def open_sync(self, path: Path, size_hint_bytes: int) -> PersistQueueStore:
        return PersistQueueStore(path, "FULL")


# ------------------------------------------------------------------ Redis Streams


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _text(value: bytes | str | None) -> str:
    """A reply of the Redis client, which gives bytes unless decode_responses is set."""
    if value is None:
        raise LookupError("redis answered nil where the bench expected an entry")
    return value.decode() if isinstance(value, bytes) else value


class RedisServer:
    """A private redis-server on 127.0.0.1:<free port> in its own dir; stopped by PID."""

    def __init__(self, binary: str, path: Path, appendfsync: str) -> None:
        import redis

        path.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [
                binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(path),
                "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "",
                "--daemonize", "no", "--protected-mode", "yes", "--logfile", str(path / "redis.log"),
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=60)
            deadline = time.monotonic() + REDIS_START_TIMEOUT_S
            while True:
                try:
                    self.client.ping()
                    break
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not start (see {path / 'redis.log'})") from None
                    time.sleep(0.02)  # an external process: nothing to wait on but its port
        except BaseException:
            self.stop()
            raise

    def version(self) -> str:
        return str(self.client.info("server").get("redis_version"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(REDIS_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RedisStore:
    KEYS_HASH = "bench:keys"

    def __init__(self, binary: str, path: Path, appendfsync: str) -> None:
        self.server = RedisServer(binary, path, appendfsync)
        self.r = self.server.client
        self.next_seq: dict[tuple[str, int], int] = {}

    @staticmethod
    def _stream(topic: str, queue_id: int) -> str:
        return f"bench:{topic}:{queue_id}"

    def _xadd(self, pipe: Any, m: BenchMessage) -> tuple[str, str]:
        # Explicit ids (0-seq) let the key hash be filled in the same pipeline.
        q = (m.topic, m.queue_id)
        seq = self.next_seq.get(q, 0) + 1
        self.next_seq[q] = seq
        stream, sid = self._stream(m.topic, m.queue_id), f"0-{seq}"
        pipe.xadd(stream, {"tag": m.tag, "key": m.key, "body": m.body}, id=sid)
        return m.key, f"{stream}|{sid}"

    def append(self, batches: Sequence[Sequence[BenchMessage]]) -> None:
        for batch in batches:
            pipe = self.r.pipeline(transaction=False)
            mapping: dict[str | bytes, str | bytes] = dict(self._xadd(pipe, m) for m in batch)
            pipe.hset(self.KEYS_HASH, mapping=mapping)  # type: ignore[arg-type]  # redis's Mapping is invariant in its key type
            pipe.execute()

    def settle(self, per_queue: dict[tuple[str, int], int]) -> None:
        pass

    def read_all(self, per_queue: dict[tuple[str, int], int]) -> int:
        read = 0
        for topic, queue_id in per_queue:
            stream, start = self._stream(topic, queue_id), "-"
            while True:
                rows = self.r.xrange(stream, min=start, max="+", count=BATCH_SIZE_MSGS)
                if not rows:
                    break
                read += len(rows)
                start = "(" + _text(rows[-1][0])
        return read

    def lookup(self, keys: Sequence[str]) -> list[float]:
        # Pipelined in groups of 32 (HGET round trip, then XRANGE round trip); a key's latency
        # is its group's time / group size.
        lat: list[float] = []
        for i in range(0, len(keys), BATCH_SIZE_MSGS):
            group = keys[i : i + BATCH_SIZE_MSGS]
            start = time.perf_counter()
            ids = self.r.hmget(self.KEYS_HASH, group)
            pipe = self.r.pipeline(transaction=False)
            for ref in ids:
                if ref is None:
                    raise LookupError("key not found in redis hash")
                stream, sid = _text(ref).split("|")
                pipe.xrange(stream, min=sid, max=sid, count=1)
            found = pipe.execute()
            if not all(found):
                raise LookupError("stream entry missing")
            lat.extend([(time.perf_counter() - start) / len(group)] * len(group))
        return lat

    def _one_round_trip_each(self, per_thread: Sequence[Sequence[BenchMessage]], *, multi: bool) -> int:
        """XADD and HSET per message in one pipeline (in MULTI if `multi`). Thread t owns
        queue t, so its explicit ids are monotonic without a shared lock."""

        def put(t: int, m: BenchMessage) -> None:
            pipe = self.r.pipeline(transaction=multi)
            key, ref = self._xadd(pipe, m)
            pipe.hset(self.KEYS_HASH, key, ref)
            pipe.execute()

        return run_threads(per_thread, put)

    def append_sync(self, per_thread: Sequence[Sequence[BenchMessage]]) -> int:
        return self._one_round_trip_each(per_thread, multi=True)

    def put_each(self, per_thread: Sequence[Sequence[BenchMessage]]) -> None:
        self._one_round_trip_each(per_thread, multi=False)

    def put_pipelined(self, messages: Sequence[BenchMessage], window: int) -> None:
        # Redis's own pipelining: each message its XADD and HSET, `window` messages sent
        # before their replies are read.
        for i in range(0, len(messages), window):
            pipe = self.r.pipeline(transaction=False)
            for m in messages[i : i + window]:
                key, ref = self._xadd(pipe, m)
                pipe.hset(self.KEYS_HASH, key, ref)
            pipe.execute()

    def close(self) -> None:
        self.server.stop()


class RedisSystem:
    name = "redis_streams"
    required = False

    def __init__(self) -> None:
        self.binary = shutil.which("redis-server")
        self.notes = {
            "api": "XADD with explicit ids + HSET key->id, pipelines of 32 (no MULTI); read XRANGE COUNT 32; lookup HMGET then XRANGE, pipelined in groups of 32 (per-key latency = group time / 32)",
            "sync": "appendfsync always; 16 threads, one MULTI(XADD, HSET) per message",
            "server": "redis-server started by the benchmark on 127.0.0.1:<free port>, own temp dir, stopped by PID",
            "put_each": "appendfsync everysec; one round trip (XADD + HSET, no MULTI) per message from 4 or 16 threads; pipelined: XADD + HSET per message, 1024 messages per pipeline",
        }

    def unavailable_reason(self) -> str | None:
        if self.binary is None:
            return "redis-server binary not installed (Debian package redis-server); skipped"
        try:
            import redis  # noqa: F401
        except ImportError as e:
            return f"python redis client not importable: {e}"
        return None

    def durability(self) -> dict[str, str]:
        return {"async": "appendonly yes, appendfsync everysec", "sync": "appendonly yes, appendfsync always"}

    def versions(self) -> dict[str, str]:
        import redis

        out = {"redis-py": redis.__version__}
        if self.binary:
            proc = subprocess.run([self.binary, "--version"], capture_output=True, text=True, check=False)
            out["redis-server"] = proc.stdout.strip()
        return out

    def open_async(self, path: Path, size_hint_bytes: int) -> RedisStore:
        assert self.binary is not None
        return RedisStore(self.binary, path, "everysec")

    def open_sync(self, path: Path, size_hint_bytes: int) -> RedisStore:
        assert self.binary is not None
        return RedisStore(self.binary, path, "always")


# ------------------------------------------------------------------ plain-Python floor

# total length, queue id, topic length, tag length, key length; then topic, tag, key, body
_FLOOR_HEAD = struct.Struct(">IIBBH")


def _floor_record(m: BenchMessage) -> bytes:
    topic, tag, key = m.topic.encode(), m.tag.encode(), m.key.encode()
    n = _FLOOR_HEAD.size + len(topic) + len(tag) + len(key) + len(m.body)
    return _FLOOR_HEAD.pack(n, m.queue_id, len(topic), len(tag), len(key)) + topic + tag + key + m.body


class FloorStore:
    """Length-prefixed records into a preallocated mmap, a dict as the key index: what any
    Python store pays at least for the same data."""

    def __init__(self, path: Path, size_hint_bytes: int, sync: bool) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.size = max(mmap.PAGESIZE, size_hint_bytes)
        self.fd = os.open(path / "log.bin", os.O_RDWR | os.O_CREAT, 0o600)
        os.posix_fallocate(self.fd, 0, self.size)
        self.mm = mmap.mmap(self.fd, self.size)
        self.pos = 0
        self.index: dict[str, int] = {}
        self.sync = sync

    def _append_one(self, m: BenchMessage) -> int:
        rec = _floor_record(m)
        start = self.pos
        self.mm[start : start + len(rec)] = rec
        self.pos = start + len(rec)
        self.index[m.key] = start
        return start

    def append(self, batches: Sequence[Sequence[BenchMessage]]) -> None:
        for batch in batches:
            for m in batch:
                self._append_one(m)

    def settle(self, per_queue: dict[tuple[str, int], int]) -> None:
        pass

    def _decode(self, pos: int) -> tuple[int, int, str, str, str, bytes]:
        n, q, tl, gl, kl = _FLOOR_HEAD.unpack_from(self.mm, pos)
        p = pos + _FLOOR_HEAD.size
        topic = self.mm[p : p + tl].decode()
        tag = self.mm[p + tl : p + tl + gl].decode()
        key = self.mm[p + tl + gl : p + tl + gl + kl].decode()
        body = self.mm[p + tl + gl + kl : pos + n]
        return n, q, topic, tag, key, body

    def read_all(self, per_queue: dict[tuple[str, int], int]) -> int:
        # One sequential scan of the log (queues interleaved): the cheapest possible read.
        pos, read = 0, 0
        while pos < self.pos:
            pos += self._decode(pos)[0]
            read += 1
        return read

    def lookup(self, keys: Sequence[str]) -> list[float]:
        return _timed_each(keys, lambda k: self._decode(self.index[k]))

    def append_sync(self, per_thread: Sequence[Sequence[BenchMessage]]) -> int:
        # One thread: a plain file has no group commit, so each message pays one msync.
        page = mmap.PAGESIZE
        for msgs in zip(*per_thread, strict=False):
            for m in msgs:
                start = self._append_one(m)
                aligned = start - start % page
                self.mm.flush(aligned, self.pos - aligned)
        return 1

    def put_each(self, per_thread: Sequence[Sequence[BenchMessage]]) -> None:
        lock = threading.Lock()  # one file, one position: the threads take turns

        def put(_t: int, m: BenchMessage) -> None:
            with lock:
                self._append_one(m)

        run_threads(per_thread, put)

    def put_pipelined(self, messages: Sequence[BenchMessage], window: int) -> None:
        for m in messages:  # nothing to wait for: an append is done when it returns
            self._append_one(m)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class FloorSystem:
    name = "floor_mmap"
    required = False

    def __init__(self) -> None:
        self.notes = {
            "what": "plain Python: length-prefixed records into a preallocated mmap, in-memory dict key index; read = one sequential scan",
            "sync": "one thread, mmap.flush (msync) per message",
            "put_each": "the threads take turns on a lock around one append each; pipelined = appends in a loop",
        }

    def unavailable_reason(self) -> str | None:
        return None

    def durability(self) -> dict[str, str]:
        return {"async": "no flush (page cache)", "sync": "msync per message"}

    def versions(self) -> dict[str, str]:
        return {}

    def open_async(self, path: Path, size_hint_bytes: int) -> FloorStore:
        return FloorStore(path, size_hint_bytes, sync=False)

    def open_sync(self, path: Path, size_hint_bytes: int) -> FloorStore:
        return FloorStore(path, size_hint_bytes, sync=True)


ALTERNATIVES: dict[str, Callable[[], Any]] = {
    "sqlite": SqliteSystem,
    "lmdb": LmdbSystem,
    "persistqueue": PersistQueueSystem,
    "redis_streams": RedisSystem,
    "floor_mmap": FloorSystem,
}

# Those the smoke test can run in-process without a server.
SERVERLESS = ("sqlite", "lmdb", "persistqueue", "floor_mmap")

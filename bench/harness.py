"""Measuring machinery: timed phases with peak RSS, statistics, the disk's own limit,
machine facts, ratios and the printed table. No store-specific code lives here.
"""

from __future__ import annotations

import dataclasses
import shutil
import datetime as dt
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TextIO

import psutil

from mqstore.bench.workload import (
    BATCH_SIZE_MSGS,
    PIPELINE_WINDOW,
    PUT_EACH_THREADS,
    BenchConfig,
    BenchMessage,
    batches,
    expected_per_queue,
    lookup_keys,
    make_async_messages,
    make_sync_messages,
    split_by_thread,
)
from mqstore.log import get_logger

log = get_logger(__name__)

ASYNC = "async"
SYNC = "sync"

# metric name -> (unit, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "msgs_per_s": ("msg/s", True),
    "mb_per_s": ("MB/s", True),
    "keys_per_s": ("key/s", True),
    "gb_per_s": ("GB/s", True),
    "floor_gb_per_s": ("GB/s", True),
    "open_s": ("s", False),
    "open_cpu_s": ("s", False),
    "ready_s": ("s", False),
    "ready_cpu_s": ("s", False),
    "recover_s": ("s", False),
    "p50_us": ("us", False),
    "p99_us": ("us", False),
}

# (our case, their case, class): ratios are only ever computed within one durability class.
COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("put_batch", "append", ASYNC),
    ("get", "read", ASYNC),
    ("query", "lookup", ASYNC),
    ("sync_put_16", "append_sync", SYNC),
    ("put_each_4", "put_each_4", ASYNC),
    ("put_each_16", "put_each_16", ASYNC),
    ("put_pipelined", "put_pipelined", ASYNC),
)
OURS = "ours"


class AsyncHandle(Protocol):
    """One open store of the async class, holding one repeat's data."""

    def append(self, batches: Sequence[Sequence[BenchMessage]]) -> None: ...
    def settle(self, per_queue: dict[tuple[str, int], int]) -> None: ...  # untimed catch-up
    def read_all(self, per_queue: dict[tuple[str, int], int]) -> int: ...
    def lookup(self, keys: Sequence[str]) -> list[float]: ...
    # Single-message puts (issue 16's rows), each on a fresh handle: one call per message,
    # each acknowledged before that thread's next; and one thread with up to `window`
    # unacknowledged (NotSupported where the API has no such thing).
    def put_each(self, per_thread: Sequence[Sequence[BenchMessage]]) -> None: ...
    def put_pipelined(self, messages: Sequence[BenchMessage], window: int) -> None: ...
    def close(self) -> None: ...


class SyncHandle(Protocol):
    def append_sync(self, per_thread: Sequence[Sequence[BenchMessage]]) -> int: ...  # threads used
    def close(self) -> None: ...


class System(Protocol):
    """An alternative (or our store) as the harness sees it."""

    name: str
    required: bool  # True: unavailable means the run failed (ours), not a skip
    notes: dict[str, str]  # free text, copied into the JSON and the table

    def unavailable_reason(self) -> str | None: ...
    def durability(self) -> dict[str, str]: ...
    def versions(self) -> dict[str, str]: ...
    def open_async(self, path: Path, size_hint_bytes: int) -> AsyncHandle: ...
    def open_sync(self, path: Path, size_hint_bytes: int) -> SyncHandle: ...


class BenchFailure(RuntimeError):
    """A case that could not produce an honest figure (wrong read-back count, missing API)."""


class NotSupported(Exception):
    """The library has no such operation (e.g. persist-queue has no key lookup)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """One repeat of one case."""

    metrics: dict[str, float]
    peak_rss_mb: float
    note: str | None = None


# ---------------------------------------------------------------- measuring


class RssSampler:
    """Samples RSS of this process and its children (redis-server) while a phase runs.

    ru_maxrss is a lifetime high-water mark, useless per case; sampling every 10 ms misses
    short spikes but sees the steady working set of each case.

    The children are listed once, when the phase starts (the systems start their servers
    before it): listing them walks all of /proc, ~0.5 ms of CPU a sample, and at 100 samples/s
    that cost the measured store 10-25% of its put_batch rate through the GIL.
    """

    interval_s = 0.01

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self._children: list[psutil.Process] = []
        self._peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _rss_bytes(self) -> int:
        total = self._proc.memory_info().rss
        for child in self._children:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass  # a child that exited since the phase started
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._peak_bytes = max(self._peak_bytes, self._rss_bytes())

    def __enter__(self) -> RssSampler:
        self._children = self._proc.children(recursive=True)
        self._peak_bytes = self._rss_bytes()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._peak_bytes = max(self._peak_bytes, self._rss_bytes())

    @property
    def peak_mb(self) -> float:
        return self._peak_bytes / 1e6


@dataclasses.dataclass(slots=True)
class Timed:
    elapsed_s: float = 0.0
    peak_rss_mb: float = 0.0


@contextmanager
def timed() -> Iterator[Timed]:
    t = Timed()
    with RssSampler() as rss:
        start = time.perf_counter()
        try:
            yield t
        finally:
            t.elapsed_s = time.perf_counter() - start
    t.peak_rss_mb = rss.peak_mb


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def latency_metrics(latencies_s: Sequence[float], elapsed_s: float) -> dict[str, float]:
    return {
        "keys_per_s": len(latencies_s) / elapsed_s,
        "p50_us": percentile(latencies_s, 50) * 1e6,
        "p99_us": percentile(latencies_s, 99) * 1e6,
    }


def throughput_metrics(count: int, payload_bytes: int, elapsed_s: float) -> dict[str, float]:
    return {"msgs_per_s": count / elapsed_s, "mb_per_s": payload_bytes / elapsed_s / 1e6}


# ---------------------------------------------------------------- results


@dataclasses.dataclass(slots=True)
class CaseRecord:
    system: str
    case: str
    durability_class: str
    body_bytes: int | None
    samples: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    peak_rss_mb: list[float] = dataclasses.field(default_factory=list)
    note: str | None = None
    error: str | None = None
    status: str = "ok"  # ok | failed | not_available | skipped

    def to_json(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for name, values in self.samples.items():
            unit, higher = METRICS[name]
            metrics[name] = {
                "unit": unit,
                "higher_is_better": higher,
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "samples": values,
            }
        return {
            "system": self.system,
            "case": self.case,
            "class": self.durability_class,
            "body_bytes": self.body_bytes,
            "status": self.status,
            "metrics": metrics,
            "peak_rss_mb": max(self.peak_rss_mb) if self.peak_rss_mb else None,
            "note": self.note,
            "error": self.error,
        }


class Recorder:
    """Collects one sample per repeat into per-case records, keyed by (system, case, class, body)."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str, str, int | None], CaseRecord] = {}

    def _get(self, system: str, case: str, cls: str, body: int | None) -> CaseRecord:
        key = (system, case, cls, body)
        if key not in self._records:
            self._records[key] = CaseRecord(system, case, cls, body)
        return self._records[key]

    def sample(
        self,
        system: str,
        case: str,
        cls: str,
        body: int | None,
        metrics: dict[str, float],
        peak_rss_mb: float | None = None,
        note: str | None = None,
    ) -> None:
        rec = self._get(system, case, cls, body)
        for name, value in metrics.items():
            assert name in METRICS, name
            rec.samples.setdefault(name, []).append(value)
        if peak_rss_mb is not None:
            rec.peak_rss_mb.append(peak_rss_mb)
        if note:
            rec.note = note

    def mark(
        self, system: str, case: str, cls: str, body: int | None, status: str, message: str
    ) -> None:
        rec = self._get(system, case, cls, body)
        rec.status = status
        if status == "failed":
            rec.error = message
        else:
            rec.note = message

    def cases(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self._records.values()]


def compute_ratios(cases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """ours / theirs for every metric both sides measured, from the reported medians."""
    index = {(c["system"], c["case"], c["class"], c["body_bytes"]): c for c in cases}
    ratios: list[dict[str, Any]] = []
    for ours_case, their_case, cls in COMPARISONS:
        for (system, case, c_cls, body), theirs in index.items():
            if system == OURS or case != their_case or c_cls != cls:
                continue
            ours = index.get((OURS, ours_case, cls, body))
            if ours is None:
                continue
            for metric, t in theirs["metrics"].items():
                o = ours["metrics"].get(metric)
                if o is None or t["median"] == 0:
                    continue
                ratios.append(
                    {
                        "class": cls,
                        "body_bytes": body,
                        "ours_case": ours_case,
                        "system": system,
                        "their_case": their_case,
                        "metric": metric,
                        "higher_is_better": t["higher_is_better"],
                        "ours": o["median"],
                        "theirs": t["median"],
                        "ratio": o["median"] / t["median"],
                    }
                )
    return ratios


# ---------------------------------------------------------------- the disk's own limit


def measure_disk(path: Path, cfg: BenchConfig) -> dict[str, Any]:
    """Sequential write with one fsync at the end, and append+fdatasync latency, in `path`."""
    path.mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(1024 * 1024)
    seq_mb_s: list[float] = []
    lat_p50: list[float] = []
    lat_p99: list[float] = []
    pre_p50: list[float] = []
    pre_p99: list[float] = []
    for rep in range(cfg.repeats):
        f = path / f"seq-{rep}.bin"
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            start = time.perf_counter()
            written = 0
            while written < cfg.disk_seq_write_bytes:
                written += os.write(fd, chunk)
            os.fsync(fd)
            seq_mb_s.append(written / (time.perf_counter() - start) / 1e6)
        finally:
            os.close(fd)
            f.unlink()
        f = path / f"lat-{rep}.bin"
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        record = os.urandom(BATCH_SIZE_MSGS * 32)  # about one small batch
        lat: list[float] = []
        try:
            for _ in range(cfg.disk_fdatasync_samples):
                start = time.perf_counter()
                os.write(fd, record)
                os.fdatasync(fd)
                lat.append(time.perf_counter() - start)
        finally:
            os.close(fd)
            f.unlink()
        lat_p50.append(percentile(lat, 50) * 1e6)
        lat_p99.append(percentile(lat, 99) * 1e6)
        # Overwriting already-written blocks (what an mmap'd segment or a reused WAL does)
        # needs no metadata update, so it can be much cheaper than appending.
        f = path / f"pre-{rep}.bin"
        fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        lat = []
        try:
            os.write(fd, bytes(len(record) * cfg.disk_fdatasync_samples))
            os.fsync(fd)
            for i in range(cfg.disk_fdatasync_samples):
                start = time.perf_counter()
                os.pwrite(fd, record, i * len(record))
                os.fdatasync(fd)
                lat.append(time.perf_counter() - start)
        finally:
            os.close(fd)
            f.unlink()
        pre_p50.append(percentile(lat, 50) * 1e6)
        pre_p99.append(percentile(lat, 99) * 1e6)

    def stats(values: list[float], unit: str) -> dict[str, Any]:
        return {
            "unit": unit,
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "samples": values,
        }

    return {
        "path": str(path),
        "seq_write_fsync_mb_s": stats(seq_mb_s, "MB/s"),
        "append_fdatasync_p50_us": stats(lat_p50, "us"),
        "append_fdatasync_p99_us": stats(lat_p99, "us"),
        "overwrite_fdatasync_p50_us": stats(pre_p50, "us"),
        "overwrite_fdatasync_p99_us": stats(pre_p99, "us"),
        "method": (
            f"sequential: {cfg.disk_seq_write_bytes} B in 1 MiB writes then one fsync; "
            f"latency: {cfg.disk_fdatasync_samples} x ({BATCH_SIZE_MSGS * 32} B + fdatasync), "
            "appending to a new file and overwriting an already-written one"
        ),
    }


# ---------------------------------------------------------------- machine facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem_of(path: Path) -> dict[str, str]:
    best: Any = None  # a psutil sdiskpart (its class is private)
    resolved = str(path.resolve())
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if resolved == mp or resolved.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) > len(best.mountpoint):
                best = part
    if best is None:
        return {"fstype": "unknown"}
    return {"fstype": best.fstype, "device": best.device, "mountpoint": best.mountpoint}


def machine_info(data_dir: Path) -> dict[str, Any]:
    vm = psutil.virtual_memory()
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        # `taskset -c 0 mqstore bench` runs every system on one CPU (threads and child
        # servers inherit the mask): the README's one-CPU table.
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_bytes": vm.total,
        "disk": _filesystem_of(data_dir),
        "data_dir": str(data_dir),
        "python": sys.version,
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "load_avg_at_start": list(os.getloadavg()),
    }


# ---------------------------------------------------------------- the table


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def pinned_note(machine: dict[str, Any]) -> str:
    """' (process on CPU 0)' when the run was confined to fewer CPUs than the machine has."""
    cpus = machine.get("cpu_affinity")
    if not cpus or len(cpus) >= (machine.get("logical_cores") or 0):
        return ""
    return f" (process on CPU{'s' if len(cpus) > 1 else ''} {','.join(map(str, cpus))})"


def write_table(result: dict[str, Any], out: TextIO) -> None:
    """Absolute figures (median [min-max]) and, for our comparable cases, ours/theirs."""
    ratio_of: dict[tuple[str, str, str, int | None, str], float] = {
        (r["system"], r["their_case"], r["class"], r["body_bytes"], r["metric"]): r["ratio"]
        for r in result["ratios"]
    }
    disk = result["disk"]
    out.write(
        f"\nmqstore bench ({result['mode']}) on {result['machine']['cpu_model']}, "
        f"{result['machine']['logical_cores']} cores{pinned_note(result['machine'])}, "
        f"{result['machine']['disk'].get('fstype')}\n"
        f"disk: seq write+fsync {_fmt(disk['seq_write_fsync_mb_s']['median'])} MB/s, "
        f"append+fdatasync p50 {_fmt(disk['append_fdatasync_p50_us']['median'])} us "
        f"p99 {_fmt(disk['append_fdatasync_p99_us']['median'])} us; "
        f"overwrite+fdatasync p50 {_fmt(disk['overwrite_fdatasync_p50_us']['median'])} us "
        f"p99 {_fmt(disk['overwrite_fdatasync_p99_us']['median'])} us\n"
        "ratio = ours/theirs from medians; for msg/s, MB/s, key/s higher is better for us, "
        "for latencies (us) lower is\n\n"
    )
    header = f"{'class':<6} {'case':<12} {'body':>5} {'system':<13} {'metric':<14} {'median':>12} {'min..max':>23} {'rss MB':>7} {'ours/theirs':>11}\n"
    out.write(header)
    out.write("-" * (len(header) - 1) + "\n")
    order = {s: i for i, s in enumerate(result["systems"])}
    generic = {ours_case: their_case for ours_case, their_case, _ in COMPARISONS}
    # Our comparable case sorts with the alternatives' case it is compared to.
    cases = sorted(
        result["cases"],
        key=lambda c: (
            c["class"],
            generic.get(c["case"], c["case"]) if c["system"] == OURS else c["case"],
            c["body_bytes"] or 0,
            order.get(c["system"], 99),
        ),
    )
    for c in cases:
        lead = f"{c['class']:<6} {c['case']:<12} {c['body_bytes'] or '':>5} {c['system']:<13}"
        if c["status"] != "ok":
            why = c["error"] or c["note"] or ""
            out.write(f"{lead} {c['status'].upper()}: {why}\n")
            continue
        rss = f"{c['peak_rss_mb']:.0f}" if c["peak_rss_mb"] is not None else ""
        for metric, m in c["metrics"].items():
            ratio = ratio_of.get((c["system"], c["case"], c["class"], c["body_bytes"], metric))
            span = f"{_fmt(m['min'])}..{_fmt(m['max'])}"
            out.write(
                f"{lead} {metric:<14} {_fmt(m['median']):>12} {span:>23} {rss:>7} "
                f"{'' if ratio is None else f'{ratio:.2f}':>11}\n"
            )
    notes = [
        (name, s.get("notes", {})) for name, s in result["systems"].items() if s.get("notes")
    ]
    if notes:
        out.write("\nnotes:\n")
        for name, per in notes:
            for what, text in per.items():
                out.write(f"  {name} [{what}]: {text}\n")
    out.write("\n")


# ---------------------------------------------------------------- running


PUT_EACH_CASES = tuple(f"put_each_{threads}" for threads in PUT_EACH_THREADS)
GENERIC_CASES = ("append", "read", "lookup", "append_sync", *PUT_EACH_CASES, "put_pipelined")
OURS_ONLY_CASES = ("lag", "recovery", "open_clean", "open_crash")


def case_name(system: System, generic: str) -> str:
    names: dict[str, str] = getattr(system, "case_names", {})
    return names.get(generic, generic)


def run_case(
    rec: Recorder,
    system: str,
    case: str,
    cls: str,
    body: int | None,
    fn: Callable[[], Outcome],
    note: str | None = None,
) -> bool:
    """Runs one repeat of one case. A failure is recorded against that case (and fails the
    run) rather than aborting it, so one broken system cannot hide the others' figures."""
    try:
        out = fn()
    except NotSupported as e:
        rec.mark(system, case, cls, body, "not_available", str(e))
        return False
    except Exception as e:  # noqa: BLE001 - recorded in the JSON, logged, and sets exit code 1
        log.error("bench case failed", system=system, case=case, body_bytes=body, error=repr(e))
        rec.mark(system, case, cls, body, "failed", f"{type(e).__name__}: {e}")
        return False
    rec.sample(system, case, cls, body, out.metrics, out.peak_rss_mb, out.note or note)
    return True


def _async_repeat(
    rec: Recorder, system: System, path: Path, msgs: list[BenchMessage], keys: list[str], body: int
) -> None:
    per_queue = expected_per_queue(msgs)
    payload = sum(len(m.body) for m in msgs)
    names = {g: case_name(system, g) for g in GENERIC_CASES}
    try:
        handle = system.open_async(path, size_hint_bytes=payload * 2 + len(msgs) * 256)
    except Exception as e:  # noqa: BLE001 - as in run_case
        for g in ("append", "read", "lookup"):
            rec.mark(system.name, names[g], ASYNC, body, "failed", f"open: {type(e).__name__}: {e}")
        log.error("bench open failed", system=system.name, error=repr(e))
        return
    try:

        def append() -> Outcome:
            with timed() as t:
                handle.append(batches(msgs))
            return Outcome(throughput_metrics(len(msgs), payload, t.elapsed_s), t.peak_rss_mb)

        if not run_case(rec, system.name, names["append"], ASYNC, body, append):
            return
        handle.settle(per_queue)

        def read() -> Outcome:
            with timed() as t:
                got = handle.read_all(per_queue)
            if got != len(msgs):
                raise BenchFailure(f"read back {got} of {len(msgs)} messages")
            return Outcome(throughput_metrics(got, payload, t.elapsed_s), t.peak_rss_mb)

        run_case(rec, system.name, names["read"], ASYNC, body, read)

        def lookup() -> Outcome:
            with timed() as t:
                lat = handle.lookup(keys)
            return Outcome(latency_metrics(lat, t.elapsed_s), t.peak_rss_mb)

        run_case(rec, system.name, names["lookup"], ASYNC, body, lookup)
    finally:
        handle.close()


def _sync_repeat(rec: Recorder, system: System, path: Path, per_thread: list[list[BenchMessage]], body: int) -> None:
    name = case_name(system, "append_sync")
    count = sum(len(t) for t in per_thread)
    payload = sum(len(m.body) for t in per_thread for m in t)

    def append_sync() -> Outcome:
        handle = system.open_sync(path, size_hint_bytes=payload * 2 + count * 256)
        try:
            with timed() as t:
                threads = handle.append_sync(per_thread)
        finally:
            handle.close()
        return Outcome(throughput_metrics(count, payload, t.elapsed_s), t.peak_rss_mb, f"{threads} producer thread(s)")

    run_case(rec, system.name, name, SYNC, body, append_sync)


def _single_put_repeat(rec: Recorder, system: System, path: Path, msgs: list[BenchMessage], body: int) -> None:
    """Issue 16's single-message puts, each case on a fresh handle: from 4 and 16 threads
    (each put acknowledged before that thread's next), and pipelined from one thread."""
    payload = sum(len(m.body) for m in msgs)
    size_hint = payload * 2 + len(msgs) * 256

    def on_fresh_handle(where: Path, work: Callable[[AsyncHandle], None]) -> Outcome:
        handle = system.open_async(where, size_hint_bytes=size_hint)
        try:
            with timed() as t:
                work(handle)
        finally:
            handle.close()
        return Outcome(throughput_metrics(len(msgs), payload, t.elapsed_s), t.peak_rss_mb)

    for threads, case in zip(PUT_EACH_THREADS, PUT_EACH_CASES, strict=True):
        per_thread = split_by_thread(msgs, threads)
        run_case(rec, system.name, case_name(system, case), ASYNC, body,
                 lambda: on_fresh_handle(path / case, lambda h: h.put_each(per_thread)))  # fmt: skip
    run_case(rec, system.name, case_name(system, "put_pipelined"), ASYNC, body,
             lambda: on_fresh_handle(path / "pipelined", lambda h: h.put_pipelined(msgs, PIPELINE_WINDOW)))  # fmt: skip


def run_benchmark(cfg: BenchConfig, systems: Sequence[System], data_dir: Path) -> dict[str, Any]:
    """Runs every case of every system in this process, repeats interleaved across systems so
    that the machine's noise falls on all of them alike."""
    started = time.perf_counter()
    data_dir.mkdir(parents=True, exist_ok=True)
    rec = Recorder()
    result: dict[str, Any] = {
        "schema": 1,
        "mode": cfg.mode,
        "config": dataclasses.asdict(cfg),
        "machine": machine_info(data_dir),
    }
    log.info("bench: measuring the disk", path=str(data_dir))
    result["disk"] = measure_disk(data_dir / "disk", cfg)

    available: list[System] = []
    systems_json: dict[str, Any] = {}
    for s in systems:
        reason = s.unavailable_reason()
        entry: dict[str, Any] = {"available": reason is None, "required": s.required, "notes": dict(s.notes)}
        if reason is None:
            entry["durability"] = s.durability()
            entry["versions"] = s.versions()
            available.append(s)
        else:
            entry["reason"] = reason
            status = "failed" if s.required else "not_available"
            (log.error if s.required else log.warning)("bench system unavailable", system=s.name, reason=reason)
            cases = [case_name(s, g) for g in GENERIC_CASES]
            if s.name == OURS:
                cases += list(OURS_ONLY_CASES)
            for body in cfg.body_sizes_bytes:
                for c in cases:
                    rec.mark(s.name, c, SYNC if c == case_name(s, "append_sync") else ASYNC, body, status, reason)
        systems_json[s.name] = entry
    result["systems"] = systems_json

    for body in cfg.body_sizes_bytes:
        msgs = make_async_messages(cfg.messages_per_case, body, cfg.seed)
        keys = lookup_keys(msgs, cfg.key_lookups, cfg.seed)
        per_thread = make_sync_messages(cfg.sync_messages_per_case, body, cfg.seed)
        singles = make_async_messages(cfg.single_messages_per_case, body, cfg.seed + 3)
        for rep in range(cfg.repeats):
            for s in available:
                work = data_dir / f"{s.name}-{body}-{rep}"
                log.info("bench", system=s.name, body_bytes=body, repeat=rep + 1, of=cfg.repeats)
                try:
                    _async_repeat(rec, s, work / "async", msgs, keys, body)
                    _sync_repeat(rec, s, work / "sync", per_thread, body)
                    _single_put_repeat(rec, s, work / "single", singles, body)
                    extra = getattr(s, "extra_cases", None)
                    if extra is not None:
                        extra(rec, cfg, body, msgs, work)
                finally:
                    shutil.rmtree(work, ignore_errors=True)

    result["cases"] = rec.cases()
    result["ratios"] = compute_ratios(result["cases"])
    result["duration_s"] = time.perf_counter() - started
    result["failed"] = [f"{c['system']}/{c['case']}/{c['body_bytes']}" for c in result["cases"] if c["status"] == "failed"]
    return result

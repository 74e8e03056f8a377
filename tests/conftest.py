"""Project-wide pytest hooks: tests marked `soak` or `cluster` run only when the run selects them
(`-m soak`, `-m cluster`);
the files holding a test marked `slow` run first (under xdist, a long file left for the end
kept one worker busy alone), and tests/pipeline/ runs in one worker, on one SparkSession
(`pytest_xdist_make_scheduler`); the 100k read-your-writes pairs start in their own process once
collection ends (see tests/read/ryw_child.py), so they run beside the suite: one process per
run, started by xdist's controller when workers run the suite (each worker collects every
test, and each started its own: two on a 2-vCPU machine, one of them for nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

RYW_TEST = "test_no_read_your_writes_miss_in_100k_put_then_max_offset_pairs_from_4_threads"
RYW_PAIRS, RYW_THREADS, RYW_BUDGET_S = 100_000, 4, 240
RYW_DIR_KEY = "mqstore_ryw_dir"  # xdist's workerinput: where the controller's child writes
ryw_run_key = pytest.StashKey["RywRun"]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slow_files_first(items)
    markexpr = config.getoption("-m", default="") or ""
    for marker in ("soak", "cluster"):
        if marker in markexpr and f"not {marker}" not in markexpr:
            continue
        skip = pytest.mark.skip(reason=f"{marker} test: run with -m {marker}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


def _slow_files_first(items: list[pytest.Item]) -> None:
    """Files with a test marked `slow` first, then by their number of tests, most first (as
    xdist's own reorder, which pyproject.toml turns off for this one); a file's tests keep
    their order. xdist hands a worker one file at a time in this order. The read-your-writes
    test's file comes last: its answer is the child's, started when collection ended, and
    early its worker would only wait for it."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def order(its: list[pytest.Item]) -> tuple[bool, bool, int]:
        waits = any(i.name == RYW_TEST for i in its)
        return waits, not any(i.get_closest_marker("slow") for i in its), -len(its)

    items[:] = [item for its in sorted(by_file.values(), key=order) for item in its]


class RywRun:
    """The read-your-writes child: its exit status, stdout and stderr once it ends. Started
    here (`pipe`), or by xdist's controller writing into `directory` (rc, out, err files)."""

    def __init__(self, directory: str, proc: subprocess.Popen[str] | None) -> None:
        self.directory = directory
        self.proc = proc

    def result(self, timeout_s: float) -> tuple[int, str, str]:
        if self.proc is not None:
            out, err = self.proc.communicate(timeout=timeout_s)
            return self.proc.returncode, out, err
        rc_file = Path(self.directory, "rc")
        deadline = time.monotonic() + timeout_s
        pid = int(Path(self.directory, "pid").read_text())
        while not rc_file.exists():  # another process's child: no handle to wait on
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {rc_file} after {timeout_s} s")
            if not _alive(pid) and not rc_file.exists():
                raise AssertionError(f"the child {pid} ended without its status (killed?): {_tail_of(self.directory)}")
            time.sleep(0.5)
        out, err = (Path(self.directory, name).read_text(errors="replace") for name in ("out", "err"))
        return int(rc_file.read_text()), out, err

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # (a zombie, not reaped yet by the controller, is ended)
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _tail_of(directory: str) -> str:
    return Path(directory, "err").read_text(errors="replace")[-3000:]


def _start_ryw_child(directory: str, *, to_files: bool) -> subprocess.Popen[str]:
    """In this process's group (a signal to the run's group ends it too). `to_files`: its
    output into `directory`, and its exit status into `directory/rc` once that is written."""
    child = Path(__file__).with_name("read") / "ryw_child.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    env.update({k: v for k, v in os.environ.items() if k == "MQSTORE_PURE_PYTHON"})
    argv = [sys.executable, str(child), os.path.join(directory, "store"), str(RYW_PAIRS), str(RYW_THREADS), str(RYW_BUDGET_S)]
    if to_files:
        with open(os.path.join(directory, "out"), "w") as out, open(os.path.join(directory, "err"), "w") as err:
            proc = subprocess.Popen([*argv, os.path.join(directory, "rc")], stdout=out, stderr=err, text=True, env=env,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
        Path(directory, "pid").write_text(str(proc.pid))
        return proc
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)  # fmt: skip


def start_ryw_pairs(config: pytest.Config) -> RywRun:
    """The read-your-writes child of this run: the controller's, when this is an xdist worker;
    else this process's own, started once per session."""
    if ryw_run_key not in config.stash:
        workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        if workerinput is not None and RYW_DIR_KEY in workerinput:
            config.stash[ryw_run_key] = RywRun(workerinput[RYW_DIR_KEY], None)
        else:
            directory = tempfile.mkdtemp(prefix="mqstore-ryw-")
            config.stash[ryw_run_key] = RywRun(directory, _start_ryw_child(directory, to_files=False))
    return config.stash[ryw_run_key]


@pytest.fixture(scope="session")
def ryw_pairs_run(request: pytest.FixtureRequest) -> RywRun:
    """The read-your-writes child, started at collection's end (or now, if it was not)."""
    return start_ryw_pairs(request.config)


def pytest_collection_finish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # the controller starts it (pytest_xdist_node_collection_finished)
    if any(item.name == RYW_TEST and not item.get_closest_marker("skip") for item in session.items):
        start_ryw_pairs(session.config)


REPO = Path(__file__).resolve().parent.parent
_WHEEL_SOURCE_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "mqstore-data", "*.so"
)


@pytest.fixture(scope="session")
def mqstore_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mqstore's wheel, built once per run from a copy of this checkout (other work in the
    checkout must not race setuptools' build/ directory; the extensions are built fresh, not
    copied). Under xdist the first worker to ask builds it into the run's shared directory, under
    a lock, and the others take that one: the packaging and standalone-cluster tests each built
    their own, ~45 s of a loaded CI run apiece."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "mqstore-wheel"
    shared.mkdir(exist_ok=True)
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dist = shared / "dist"
        built = sorted(dist.glob("mqstore-*.whl")) if dist.is_dir() else []
        if built:
            return built[0]
        source = shared / "src" / "mqstore"
        shutil.rmtree(shared / "src", ignore_errors=True)
        shutil.copytree(REPO, source, ignore=_WHEEL_SOURCE_IGNORE)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "PYTHON"))}
        result = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(shared / "building"), str(source)],
                                env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
        assert result.returncode == 0, f"building the wheel failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        (wheel,) = (shared / "building").glob("mqstore-*.whl")
        dist.mkdir()
        shutil.move(str(wheel), dist / wheel.name)  # whole, or not there: a failed build is built again
        shutil.rmtree(shared / "src", ignore_errors=True)
        return dist / wheel.name


PIPELINE_TESTS = "tests/pipeline/"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadfile, but tests/pipeline/ is one unit: its files share the worker's
    SparkSession (tests/pipeline/conftest.py), so one worker starts a JVM for them, not each
    worker (~20 s of start-up and first job on the shared 2-vCPU machine, and a second JVM's
    CPU beside the rest). As the first file in the order, the unit goes first. The
    standalone-cluster test uses no session but stays in the unit: in a unit of its own its JVMs
    and Python workers ran beside the stream test's, whose Python worker then missed Spark's
    fixed 10 s to connect back (two CI dry runs)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class PipelineTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return PIPELINE_TESTS if nodeid.startswith(PIPELINE_TESTS) else str(super()._split_scope(nodeid))

    return PipelineTogether(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller: every worker is told where the one child writes its answer."""
    config = node.config
    if ryw_run_key not in config.stash:
        config.stash[ryw_run_key] = RywRun(tempfile.mkdtemp(prefix="mqstore-ryw-"), None)
    node.workerinput[RYW_DIR_KEY] = config.stash[ryw_run_key].directory


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist's controller, once a worker collected: the child starts if the test is to run."""
    run = node.config.stash.get(ryw_run_key, None)
    if run is not None and run.proc is None and any(i.split("@", 1)[0].endswith("::" + RYW_TEST) for i in ids):
        run.proc = _start_ryw_child(run.directory, to_files=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(ryw_run_key, None)
    if run is not None and not hasattr(config, "workerinput"):  # a worker's directory is the controller's
        run.stop()

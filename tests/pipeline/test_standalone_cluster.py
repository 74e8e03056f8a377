"""The README's standalone-cluster recipe, from the pip wheel: spark-submit of a job to a real
standalone Spark master and worker on 127.0.0.1. In CI, `local-cluster`: the Master and Worker
inside spark-submit's JVM, the executor a JVM the Worker launches; with `-m cluster`, the
recipe whole, the Master and Worker started as processes.

mqstore's wheel is built from a copy of the checkout and installed (no deps) into a fresh venv
that cannot see the source tree; its third-party dependencies (pyspark, pyarrow, pykka...) come
from this environment's site-packages through a .pth file appended after the venv's own, as
installing pyspark from an index would take minutes. The master and worker are started from
that pyspark's `bin/spark-class` (the pip wheel of pyspark has no sbin/start-master.sh), on
free ports, and stopped by PID (their process groups, which hold the executors the worker
forked) in a finally block. The job is a user's script that names `format("rocketmq")` and
imports nothing of mqstore: Spark finds the source through the wheel's `pyspark_rocketmq`, and
the driver imports nothing of ours (the lookup and the reads run in the Python workers). This
test also stands for a fresh local-mode process found by name: the lookup is the driver's, the
same with either master (it was a test of its own, 17 s of the CI budget).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest


h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FIXTURE = Path("/work/shared/fixtures/broker-sample-a")
START_TIMEOUT_S = 90
SUBMIT_TIMEOUT_S = 240
# The JVMs here live a minute and run one small job: C2's compiles and the parallel GC's threads
# were most of this test's CPU (79 s of it, measured per test with getrusage, against 46-52 s with
# these flags; the largest test of the suite, whose CI run is CPU-bound on 2 vCPUs). They change
# how the JVM runs its code, not what Spark does: the recipe is the same.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# A data engineer's job: no mqstore import, no registration call.
JOB = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("rocketmq-from-the-wheel").getOrCreate()
    df = spark.read.format("rocketmq").load(sys.argv[1])
    counts = sorted((r["topic"], r["queue_id"], r["count"]) for r in df.groupBy("topic", "queue_id").count().collect())
    body_bytes = df.selectExpr("sum(length(body))").collect()[0][0]

    def where(_):
        import mqstore, pyspark_rocketmq
        return [mqstore.__file__, pyspark_rocketmq.__file__, sys.executable]

    executor = spark.sparkContext.parallelize([0], 1).map(where).collect()[0]
    # The lookup and the reads run in Spark's Python workers: the driver imports nothing.
    driver_imported = sorted(m for m in sys.modules if m.split(".")[0] in ("mqstore", "pyspark_rocketmq"))
    with open(sys.argv[2], "w") as f:
        json.dump({"counts": counts, "body_bytes": body_bytes, "executor": executor, "columns": df.columns,
                   "driver_imported": driver_imported}, f)
    spark.stop()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as exc:
        return f"<{path}: {exc}>"


def _wait_until(what: str, check: Any, timeout_s: float, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)  # polling a process we do not control; there is no event to wait on
    detail = "\n".join(f"--- {p.name} ---\n{_tail(p)}" for p in logs)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{detail}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            state = json.load(r)
    except (OSError, ValueError):
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # its own group: the JVM and the executors it forked
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def _venv_from_the_wheel(tmp_path: Path, wheel: Path) -> Path:
    """A fresh venv holding mqstore's wheel (built from a copy of this checkout, so nothing of
    the checkout is on its path); returns its python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "PYTHON"))}
    root = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], env=env, check=True, capture_output=True, timeout=300)  # fmt: skip
    pyspark = pytest.importorskip("pyspark")
    deps = os.path.dirname(os.path.dirname(pyspark.__file__))
    (site,) = (root / "lib").glob("python3*/site-packages")
    (site / "zz_deps.pth").write_text(deps + "\n")  # after the venv's own site-packages: the wheel wins
    return python


@pytest.mark.parametrize("deploy", [
    # The Master and a Worker inside spark-submit's JVM, the executor a JVM of its own that the
    # Worker launches: Spark's own tests' pseudo-cluster, the standalone scheduler and executor
    # launch the recipe uses, two JVMs fewer (~100 s of a loaded CI run). In CI.
    "local-cluster",
    # The README's recipe whole: spark-class's Master and Worker processes, and spark://.
    pytest.param("standalone", marks=pytest.mark.cluster),
])  # fmt: skip
def test_spark_submit_of_a_job_to_a_standalone_master_from_the_pip_wheel(
    tmp_path: Path, mqstore_wheel: Path, deploy: str
) -> None:
    python = _venv_from_the_wheel(tmp_path, mqstore_wheel)
    venv_root = str(python.parent.parent)
    spark_home = subprocess.run([str(python), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                                check=True, capture_output=True, text=True, cwd=tmp_path).stdout.strip()  # fmt: skip
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    spark_submit = os.path.join(spark_home, "bin", "spark-submit")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "PYTHON", "PYSPARK_", "SPARK_"))}
    env.update(
        SPARK_HOME=spark_home,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_WORKER_DIR=str(tmp_path / "worker"),  # not inside the venv
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        SPARK_DAEMON_JAVA_OPTS=SHORT_LIVED_JVM,  # the Master and Worker processes (spark-class)
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "worker", "submit")}
    master = worker = None
    try:
        if deploy == "local-cluster":
            master_url = "local-cluster[1,1,1024]"  # one worker, one core, 1 GiB
            master_log = logs["submit"]  # the in-process Master logs there
        else:
            master_port, master_ui, worker_ui = _free_port(), _free_port(), _free_port()
            master_url = f"spark://127.0.0.1:{master_port}"
            master_log = logs["master"]
            with open(logs["master"], "wb") as out:
                master = subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(master_port), "--webui-port", str(master_ui)],  # fmt: skip
                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
                )  # fmt: skip
            # The worker starts alongside (it retries registering), saving a JVM start-up of wall time.
            with open(logs["worker"], "wb") as out:
                worker = subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                     "--webui-port", str(worker_ui), "--cores", "2", "--memory", "1g", master_url],  # fmt: skip
                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
                )  # fmt: skip
            _wait_until("the master's port", lambda: master.poll() is None and _port_open(master_port),
                        START_TIMEOUT_S, [logs["master"]])  # fmt: skip
            _wait_until("a registered worker", lambda: _alive_workers(master_ui) >= 1, START_TIMEOUT_S,
                        [logs["master"], logs["worker"]])  # fmt: skip

        job = tmp_path / "my_job.py"
        job.write_text(JOB)
        out_json = tmp_path / "result.json"
        cmd = [
            spark_submit, "--master", master_url,
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.executor.memory=512m",
            "--driver-java-options", SHORT_LIVED_JVM, "--conf", f"spark.executor.extraJavaOptions={SHORT_LIVED_JVM}",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
            str(job), str(FIXTURE), str(out_json),
        ]  # fmt: skip
        with open(logs["submit"], "wb") as out:
            try:
                rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=SUBMIT_TIMEOUT_S,
                                    cwd=tmp_path).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                rc = None
        detail = "\n".join(f"--- {p.name} ---\n{_tail(p)}" for p in logs.values() if p.exists())
        assert rc == 0, f"spark-submit exited with {rc}\n{detail}"
        result = json.loads(out_json.read_text())
        records = [rec for _, _, rec in h.reference_records([FIXTURE])]
        assert len(records) == 47 and {(r.topic, r.queue_id) for r in records} == {("abc", 0)}
        assert result["counts"] == [["abc", 0, 47]], detail
        assert result["body_bytes"] == sum(len(r.body) for r in records), detail
        assert "properties" in result["columns"] and "msg_id" not in result["columns"]  # the default schema
        # The executors ran the wheel's code with the venv's python, never the checkout's.
        mqstore_file, lookup_file, executable = result["executor"]
        assert mqstore_file.startswith(venv_root) and lookup_file.startswith(venv_root), result["executor"]
        assert executable == str(python), result["executor"]
        assert result["driver_imported"] == [], result["driver_imported"]
        # The job really ran on the cluster, not in a local fallback.
        assert "Registered app" in master_log.read_text(errors="replace"), detail
        assert "Granted executor ID" in logs["submit"].read_text(errors="replace"), detail  # (the standalone backend)
    finally:
        _stop(worker)
        _stop(master)

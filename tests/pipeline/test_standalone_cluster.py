"""spark-submit of a job to a real standalone Spark master and worker on 127.0.0.1.

Both are started from the installed pyspark (`bin/spark-class`), on free ports, and stopped by
PID (their process groups, which hold the executors the worker forked) in a finally block.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FIXTURE = Path("/work/shared/fixtures/broker-sample-a")
START_TIMEOUT_S = 90
SUBMIT_TIMEOUT_S = 240


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


def test_spark_submit_of_stats_to_a_standalone_master(tmp_path: Path) -> None:
    pyspark = pytest.importorskip("pyspark")
    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    spark_submit = os.path.join(spark_home, "bin", "spark-submit")
    env = dict(os.environ)
    env.update(
        SPARK_HOME=spark_home,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_WORKER_DIR=str(tmp_path / "worker"),  # not inside the venv
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    master_port, master_ui, worker_ui = _free_port(), _free_port(), _free_port()
    master_url = f"spark://127.0.0.1:{master_port}"
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "worker", "submit")}
    master = worker = None
    try:
        with open(logs["master"], "wb") as out:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(master_port), "--webui-port", str(master_ui)],  # fmt: skip
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        # The worker starts alongside (it retries registering), saving a JVM start-up of wall time.
        with open(logs["worker"], "wb") as out:
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--webui-port", str(worker_ui), "--cores", "2", "--memory", "1g", master_url],  # fmt: skip
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        _wait_until("the master's port", lambda: master.poll() is None and _port_open(master_port), START_TIMEOUT_S,
                    [logs["master"]])  # fmt: skip
        _wait_until("a registered worker", lambda: _alive_workers(master_ui) >= 1, START_TIMEOUT_S,
                    [logs["master"], logs["worker"]])  # fmt: skip

        import mqstore.pipeline.stats as stats_job

        out_json = tmp_path / "stats.json"
        cmd = [
            spark_submit, "--master", master_url,
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.executor.memory=512m",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
            stats_job.__file__, str(FIXTURE), "--out", str(out_json),
        ]  # fmt: skip
        with open(logs["submit"], "wb") as out:
            try:
                rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=SUBMIT_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                rc = None
        detail = "\n".join(f"--- {p.name} ---\n{_tail(p)}" for p in logs.values())
        assert rc == 0, f"spark-submit exited with {rc}\n{detail}"
        result = json.loads(out_json.read_text())
        assert result["messages"] == 47 and result["bytes"] == 47 * 172, detail
        assert [(q["topic"], q["queue_id"], q["messages"]) for q in result["queues"]] == [("abc", 0, 47)]
        # The job really ran on the cluster, not in a local fallback.
        assert "app-" in _tail(logs["master"], 200) or "Registered app" in _tail(logs["master"], 200), detail
    finally:
        _stop(worker)
        _stop(master)

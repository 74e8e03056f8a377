"""The built wheel, installed into a clean venv, next to a host app with its own `config` etc.

The repository root is the `mqstore` package, so the check that matters is that nothing of ours
lands at the top level of site-packages: a host application's own `config`, `messages`,
`storage` and `actors` packages must stay the host's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

import mqstore

pytestmark = pytest.mark.slow

HOST_PACKAGES = ("config", "messages", "storage", "actors")


def _run(cmd: list[str], cwd: Path | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "PYTHON"))}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{cmd} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory, mqstore_wheel: Path) -> Path:
    """A venv without system site-packages holding only the wheel and its declared dependencies,
    installed by this environment's pip (`--python`): a pip of the venv's own cost ~9 s of CPU
    to put in, and is nothing the tests use."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=False, clear=True).create(root)
    python = root / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(mqstore_wheel)])
    return root


@pytest.fixture(scope="module")
def host_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    app = tmp_path_factory.mktemp("hostapp")
    for name in HOST_PACKAGES:
        (app / name).mkdir()
        (app / name / "__init__.py").write_text(f'MARKER = "host-{name}"\n')
    return app


def test_wheel_holds_only_the_mqstore_package_and_its_defaults(mqstore_wheel: Path) -> None:
    names = zipfile.ZipFile(mqstore_wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    # pyspark_rocketmq: Spark finds format("rocketmq") by that top-level name (issue 17).
    assert top == {"mqstore", "pyspark_rocketmq", f"mqstore-{mqstore.__version__}.dist-info"}
    assert "pyspark_rocketmq/__init__.py" in names
    assert "mqstore/config/defaults.toml" in names
    assert "mqstore/cli.py" in names and "mqstore/storage/codec.py" in names
    assert not any(name.startswith("mqstore/tests/") for name in names)


def test_host_packages_named_like_ours_stay_the_hosts(clean_venv: Path, host_app: Path) -> None:
    script = host_app / "check_imports.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import mqstore  # first, so any top-level module it leaked would shadow the host's
            from mqstore.config import StoreConfig
            import mqstore.storage.codec
            import mqstore.cli
            import config, messages, storage, actors
            for module, name in ((config, "config"), (messages, "messages"), (storage, "storage"), (actors, "actors")):
                assert module.MARKER == "host-" + name, (name, module.__file__)
            assert "site-packages" in mqstore.__file__, mqstore.__file__
            assert mqstore.config.StoreConfig is StoreConfig
            cfg = StoreConfig.load(env={})  # defaults.toml is package data of the wheel
            assert cfg.mapped_file_size_commitlog_bytes == 1073741824
            assert not hasattr(config, "StoreConfig")
            print("ok")
            """
        )
    )
    result = _run([str(clean_venv / "bin" / "python"), str(script)], cwd=host_app)
    assert result.stdout.strip() == "ok"


def test_console_script_runs_from_the_clean_venv(clean_venv: Path, host_app: Path) -> None:
    result = _run([str(clean_venv / "bin" / "mqstore"), "--help"], cwd=host_app)
    assert "dump" in result.stdout
    result = _run([str(clean_venv / "bin" / "mqstore"), "dump", "--help"], cwd=host_app)
    assert "--what" in result.stdout


def test_host_app_puts_and_reads_a_message_through_the_public_api(clean_venv: Path, host_app: Path) -> None:
    script = host_app / "use_store.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import config  # the host's own package, imported before the store
            import mqstore

            path = sys.argv[1]
            with mqstore.open(path) as store:
                r = store.put(mqstore.Message(topic="T", body=b"x"))
                assert r.ok, r
                g = store.get("T", 0, 0, 32)
                assert g.messages[0].body == b"x", g
            assert config.MARKER == "host-config"
            print("ok")
            """
        )
    )
    result = _run([str(clean_venv / "bin" / "python"), str(script), str(host_app / "data")], cwd=host_app, timeout_s=120)
    assert result.stdout.strip() == "ok"


def test_the_build_script_shipped_as_a_module_runs_nothing_when_imported(clean_venv: Path, mqstore_wheel: Path) -> None:
    """The repository root is the package, so setup.py ships as `mqstore.setup`; importing it
    ran setuptools.setup() ("error: no commands supplied", exit 1) (review 73 L5), and in a
    venv without setuptools (Python 3.12's, or this test's since it lost its own pip) the
    import failed. The wheel still carries both C extensions, so the guard did not stop the
    build either."""
    names = zipfile.ZipFile(mqstore_wheel).namelist()
    assert any(n.startswith("mqstore/storage/_native.") and n.endswith(".so") for n in names)
    assert any(n.startswith("mqstore/storage/_mapguard.") and n.endswith(".so") for n in names)
    python = clean_venv / "bin" / "python"
    result = subprocess.run([str(python), "-c", "import mqstore.setup; print('imported')"], capture_output=True, text=True,
                            timeout=60, cwd=clean_venv)  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "imported", result.stderr

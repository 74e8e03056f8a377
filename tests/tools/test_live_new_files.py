"""Read-only commands on a running store that is making its next file (review 53 L1): a segment,
ConsumeQueue or index file is created empty and then sized (O_CREAT|O_EXCL, then ftruncate), and
`dump`, `inspect` and `stats` met one in between: "files of another size than the store's
geometry (damage)", `dump` exit 3 ("file is 0 bytes"), `inspect` a damaged segment. While the
store runs, the newest file of a directory shorter than its kind's size is one being made; on a
stopped store it is still damage. Each test makes such files by hand under a store held open."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import mqstore
from mqstore.cli import main

SMALL = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 40,
             max_hash_slot_num=100, max_index_num=400)  # fmt: skip


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _being_made(root: Path) -> list[Path]:
    """An empty file where each of the store's directories gets its next one, as its owner has
    just created it (the commitlog's after the allocator's next-next, a queue's, the index's)."""
    made = []
    for directory, step in ((root / "commitlog", SMALL["mapped_file_size_commitlog_bytes"]),
                            (root / "consumequeue" / "T" / "0", SMALL["mapped_file_size_consume_queue_bytes"])):  # fmt: skip
        newest = max(int(name) for name in os.listdir(directory))
        made.append(directory / f"{newest + step:020d}")
    newest_index = max(os.listdir(root / "index"))
    made.append(root / "index" / f"{int(newest_index) + 1000:017d}")
    for path in made:
        path.touch()
    return made


def test_read_only_commands_take_a_running_stores_newest_empty_files_for_ones_being_made(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with mqstore.open(root, **SMALL) as store:
        for i in range(300):
            assert store.put(mqstore.Message("T", b"%05d" % i + b"." * 300, keys=[f"k{i}"])).ok
        made = _being_made(root)
        code, out, err = run_cli("dump", str(root))
        assert code == 0 and len(out.splitlines()) == 300 and "another size" not in err, err
        code, out, err = run_cli("dump", str(root), "--what", "index")
        assert code == 0 and "another size" not in err, err
        code, out, err = run_cli("inspect", str(root), "--json")
        report = json.loads(out)
        assert code == 0 and report["verdict"] == "running" and "another size" not in err, err
        assert report["problems"] == [] and report["commitlog"]["messages"] == 300, report["problems"]
        code, out, err = run_cli("stats", str(root), "--json")
        assert code == 0 and json.loads(out)["messages"] == 300 and "another size" not in err, err
        for path in made:  # (the store makes its own)
            path.unlink()
    for path in made:  # a stopped store's empty files are damage, as before
        path.touch()
    code, out, err = run_cli("inspect", str(root), "--json")
    kinds = {p["kind"] for p in json.loads(out)["problems"]}
    assert code == 3 and {"segment_size", "cq_file_size", "index_header"} <= kinds, kinds
    assert "another size" in err

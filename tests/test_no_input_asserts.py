"""No `assert` guards input or data (issue 19 item 8): python -O strips asserts, so a check
that refuses bad input, or that keeps data from being overwritten, must be a raise. This
runs the refusals under -O."""

from __future__ import annotations

import subprocess
import sys

CODE = r"""
import errno
from mqstore.storage.consumer_offsets import ConsumerOffsetStore
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.storage.mapped_file import MappedFile, parse_segment_offset
from mqstore.storage.mapped_file_queue import MappedFileQueue
from mqstore.storage.index import IndexFile

fs = SimulatedFileSystem()
fs.makedirs("/d")
refused = []
def expect(error, call):
    try:
        call()
    except error:
        refused.append(True)
    else:
        refused.append(False)

offsets = ConsumerOffsetStore(fs, "/s")
expect(ValueError, lambda: offsets.commit_offset("g", "T", 0, -5))
expect(ValueError, lambda: offsets.commit_offset("g", "T", -1, 0))
expect(ValueError, lambda: offsets.commit_offset("g", "T", 0, 2**70))
expect(ValueError, lambda: parse_segment_offset("/d/notasegment"))
expect(ValueError, lambda: MappedFile(fs, "/d/00000000000000000000", 0))
expect(ValueError, lambda: MappedFileQueue(fs, "/d", 0, clock_ms=lambda: 0))
f = IndexFile.create(fs, "/d/20240101000000000", max_hash_slot_num=4, max_index_num=4)
f.close()
expect(FileExistsError, lambda: IndexFile.create(fs, "/d/20240101000000000", max_hash_slot_num=4, max_index_num=4))
mf = MappedFile(fs, "/d/00000000000000001000", 4096)
mf.append_bytes(b"x")
expect(RuntimeError, lambda: mf.warm_up(False, 0))
print(refused)
"""


def test_refusals_hold_under_python_dash_o() -> None:
    out = subprocess.run([sys.executable, "-O", "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([True] * 8), out

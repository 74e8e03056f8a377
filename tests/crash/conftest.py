"""The crash tests import their shared helpers from crashlib.py, next to this file.

Replay and soak knobs are CRASH_SEED and CRASH_SOAK_KILLS. The older MQSTORE_CRASH_SEED and
MQSTORE_SOAK_KILLS still work, but are moved to the new names here: every MQSTORE_* variable
is a store setting to StoreConfig, which rejects unknown ones, so with them set every
mqstore.open (in this process and in the producer child) failed.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

for _old, _new in (("MQSTORE_CRASH_SEED", "CRASH_SEED"), ("MQSTORE_SOAK_KILLS", "CRASH_SOAK_KILLS")):
    if _old in os.environ:
        os.environ.setdefault(_new, os.environ.pop(_old))

"""The C kernels of storage/_native.c, or None.

None when the extension was not built (no C compiler at install time) or when
MQSTORE_PURE_PYTHON=1 asks for the reference Python paths; both give the same bytes.
Call sites read `speedups.native` at call time, so a test can switch paths per case.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["native", "pure_python_requested"]


def pure_python_requested() -> bool:
    return os.environ.get("MQSTORE_PURE_PYTHON", "").strip().lower() in {"1", "true", "yes", "on"}


def _load() -> ModuleType | None:
    if pure_python_requested():
        return None
    try:  # a C extension: no type information, a plain module here
        return importlib.import_module(f"{__package__}._native")
    except ImportError:
        return None


native: ModuleType | None = _load()

"""Which core runs: the compiled modules (Cython, built by setup.py where a C compiler works) or the
pure-Python ones they mirror, which stay as the reference and as the core of an install without a
compiler. ``KVGATEWAY_NO_EXTENSIONS=1`` forces the pure-Python core (read at import).

Each accelerated module asks :func:`load` for its compiled twin at import and falls back to its
pure module when it gets None; :func:`core` says which core the process runs (``kvgateway --version``
and the ``kvgateway_build_info`` gauge)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Final

from kvgateway.config.options import NO_EXTENSIONS_ENV

__all__ = ["COMPILED", "NO_EXTENSIONS_ENV", "PURE", "core", "forced_pure", "load"]

COMPILED: Final = "compiled"
PURE: Final = "pure-Python"

COMPILED_MODULES: Final = (
    "kvgateway.state._learner_c",
    "kvgateway.protocol._render_c",
    "kvgateway.state._digest_c",
    "kvgateway.state._apply_c",
    "kvgateway.state._analytics_c",
    "kvgateway.engine._tokens_c",
    "kvgateway.engine._events_c",
    "kvgateway.engine._batch_c",
    "kvgateway.engine._receive_c",
    "kvgateway.log._ring_c",
    "kvgateway.ingest._outlet_c",
)
"""Every compiled module of the core: the core is compiled when all of them load."""

_loaded: dict[str, ModuleType | None] = {}


def forced_pure() -> bool:
    """``KVGATEWAY_NO_EXTENSIONS`` is set (to anything but empty or 0)."""
    return os.environ.get(NO_EXTENSIONS_ENV, "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None (forced pure, or not built here). Decided once per
    process, so every caller gets the same answer whatever the environment does later."""
    if name not in _loaded:
        module = None
        if not forced_pure():
            try:
                module = importlib.import_module(name)
            except ImportError:
                module = None
        _loaded[name] = module
    return _loaded[name]


def core() -> str:
    """``compiled`` when every compiled module runs, else ``pure-Python``."""
    return COMPILED if all(load(name) is not None for name in COMPILED_MODULES) else PURE

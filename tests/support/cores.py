"""The compiled twin a differential test holds against its pure-Python reference: imported, or the
test skipped (no C compiler at install, or the pure-Python core forced)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest


def compiled_twin(name: str, chosen: Callable[[ModuleType], bool] | None = None) -> ModuleType:
    """The compiled module ``name``; the test is skipped where it was not built, or where
    ``chosen(module)`` says the gateway does not run it (``KVGATEWAY_NO_EXTENSIONS``)."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        pytest.skip("the compiled core is not built here (no C compiler at install)")
    if chosen is not None and not chosen(module):
        pytest.skip("the pure-Python core is forced (KVGATEWAY_NO_EXTENSIONS)")
    return module

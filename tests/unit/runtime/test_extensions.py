"""kvgateway.runtime.extensions: which core runs. KVGATEWAY_NO_EXTENSIONS forces the pure one; each
module's answer is decided once; the core is compiled only when every compiled module loads."""

from __future__ import annotations

import pytest

from kvgateway.runtime import extensions
from kvgateway.runtime.extensions import COMPILED, COMPILED_MODULES, NO_EXTENSIONS_ENV, PURE, core, forced_pure, load


@pytest.mark.parametrize(("value", "forced"), [(None, False), ("", False), ("0", False), ("1", True), ("yes", True)])
def test_the_variable_forces_the_pure_core_unless_empty_or_zero(
    monkeypatch: pytest.MonkeyPatch, value: str | None, forced: bool
) -> None:
    if value is None:
        monkeypatch.delenv(NO_EXTENSIONS_ENV, raising=False)
    else:
        monkeypatch.setenv(NO_EXTENSIONS_ENV, value)
    assert forced_pure() is forced


def test_a_module_is_decided_once_and_a_missing_one_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extensions, "_loaded", {})
    monkeypatch.setenv(NO_EXTENSIONS_ENV, "1")
    assert load("kvgateway.protocol.render") is None  # forced pure: not even imported
    monkeypatch.delenv(NO_EXTENSIONS_ENV)
    assert load("kvgateway.protocol.render") is None  # decided already, whatever the environment says now
    assert load("kvgateway.no_such_compiled_module") is None
    found = load("kvgateway.runtime.tasks")  # any importable module stands in for a built one
    assert found is not None and found.__name__ == "kvgateway.runtime.tasks"


def test_the_core_is_compiled_only_when_every_compiled_module_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extensions, "_loaded", dict.fromkeys(COMPILED_MODULES, extensions))
    assert core() == COMPILED
    monkeypatch.setattr(
        extensions, "_loaded", {**dict.fromkeys(COMPILED_MODULES, extensions), COMPILED_MODULES[-1]: None}
    )
    assert core() == PURE

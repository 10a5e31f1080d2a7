"""One value of an option checked and made its kind, from text (a flag, a variable) or a TOML
value, in one wording for all three: ``--port``, ``KVGATEWAY_PORT`` or ``[server] key 'port'``
(``where``), then what is wrong."""

from __future__ import annotations

from kvgateway.config.errors import ConfigError
from kvgateway.config.options import Option


def coerce(option: Option, value: object, where: str) -> object:
    """Check one value of ``option``; ``where`` names it as the user gave it (flag, variable, key)."""
    kind = option.kind
    if isinstance(value, str) and kind is not str and kind is not list:  # flag and variable text
        text = value.strip()
        if kind is bool:
            if text.lower() not in ("true", "1", "yes", "false", "0", "no"):
                raise ConfigError(f"{where}: expected true or false, got {value!r}")
            value = text.lower() in ("true", "1", "yes")
        else:
            try:
                value = int(text) if kind is int else float(text)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise ConfigError(f"{where}: expected {what}, got {value!r}") from None
    if kind is list and isinstance(value, str):  # a variable: comma-separated
        value = [item.strip() for item in value.split(",") if item.strip()]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if not isinstance(value, kind):
        names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list"}
        raise ConfigError(f"{where}: expected {names[kind]}, got {value!r}")
    if option.limits is not None:
        low, high = option.limits
        assert isinstance(value, int | float)
        if not low <= value <= high:
            raise ConfigError(f"{where}: must be from {low:g} to {high:g}, got {value!r}")
    if option.choices:
        value = str(value).lower()
        if value not in option.choices:
            raise ConfigError(f"{where}: one of {', '.join(option.choices)}, got {value!r}")
    if kind is str and not str(value).strip():
        raise ConfigError(f"{where}: empty")
    if kind is list:
        assert isinstance(value, list)
        if not all(isinstance(item, str) and item.strip() for item in value):
            raise ConfigError(f"{where}: expected a list of non-empty strings")
        items = [item.strip() for item in value]
        return tuple(item.lower() for item in items) if option.key == "allowed_hosts" else tuple(items)
    return value

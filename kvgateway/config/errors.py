"""The one error of a bad configuration, and how an unknown name is answered."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """Invalid configuration; the message is one line naming the source and key."""


def unknown_name(what: str, name: str, known: Sequence[str], prefix: str = "") -> str:
    """``what`` (``unknown key 'ring_byts'``) with the closest known name, or every known name
    when none is close: a typo is named back, a guess gets the whole list. Names are compared
    without ``prefix`` (``KVGATEWAY_``), which would make every variable look alike."""
    import difflib  # for a mistyped name only: not in every start-up

    bare = {item.removeprefix(prefix): item for item in known}
    close = difflib.get_close_matches(name.removeprefix(prefix), bare, n=1, cutoff=0.75)
    if close:
        return f"{what}: did you mean {bare[close[0]]!r}?"
    return f"{what} (known: {', '.join(known)})"

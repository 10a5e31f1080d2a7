"""kvgateway.config.errors: an unknown name is answered with the closest known one, or them all."""

from __future__ import annotations

from kvgateway.config.errors import unknown_name


def test_a_close_name_is_named_back() -> None:
    assert unknown_name("unknown key 'ring_byts'", "ring_byts", ["ring_bytes", "port"]) == (
        "unknown key 'ring_byts': did you mean 'ring_bytes'?"
    )


def test_a_guess_gets_every_known_name() -> None:
    assert (
        unknown_name("unknown key 'colour'", "colour", ["host", "port"]) == "unknown key 'colour' (known: host, port)"
    )


def test_names_are_compared_without_the_prefix() -> None:
    """With the prefix, every KVGATEWAY_ variable would look close to every other."""
    known = ["KVGATEWAY_PORT", "KVGATEWAY_HOST"]
    assert unknown_name("x", "KVGATEWAY_COLOUR", known, "KVGATEWAY_") == "x (known: KVGATEWAY_PORT, KVGATEWAY_HOST)"
    assert unknown_name("x", "KVGATEWAY_PROT", known, "KVGATEWAY_") == "x: did you mean 'KVGATEWAY_PORT'?"

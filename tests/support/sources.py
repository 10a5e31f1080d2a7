"""The one ``--source`` builder of the tests, and the simulator's matching socket flags."""

from __future__ import annotations


def source_spec(name: str, pub: int, replay: int | None = None, dp_size: int | None = None, **keys: object) -> str:
    """``name=NAME,endpoint=tcp://127.0.0.1:PUB[,replay=tcp://127.0.0.1:REPLAY][,dp_size=N][,KEY=VALUE...]``:
    an engine on loopback, as ``--source`` takes it."""
    spec = f"name={name},endpoint=tcp://127.0.0.1:{pub}"
    if replay is not None:
        spec += f",replay=tcp://127.0.0.1:{replay}"
    if dp_size is not None:
        spec += f",dp_size={dp_size}"
    return spec + "".join(f",{key}={value}" for key, value in keys.items())


def sim_flags(pub: int, replay: int | None = None) -> list[str]:
    """``kvgateway simulate`` flags for the engine :func:`source_spec` names: like vLLM, the
    simulator binds a wildcard endpoint (a host name would mean "connect out")."""
    flags = ["--endpoint", f"tcp://*:{pub}"]
    if replay is not None:
        flags += ["--replay-endpoint", f"tcp://*:{replay}"]
    return flags


def connectable(endpoint: str) -> str:
    """A bound endpoint as a client dials it (wildcard hosts become loopback)."""
    return endpoint.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace("tcp://*:", "tcp://127.0.0.1:")

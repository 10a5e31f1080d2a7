"""kvgateway.cluster.supervisor without processes: the flags it hands its children."""

from __future__ import annotations


def test_the_supervisor_gives_children_the_shared_flags_only() -> None:
    from kvgateway.cluster.supervisor import _server_argv

    argv = ["serve", "--source", "name=a,endpoint=tcp://h:1", "--workers=2", "--port", "8080", "--state-dir", "/s"]
    assert _server_argv([*argv, "--token-file", "t"]) == ["--source", "name=a,endpoint=tcp://h:1", "--token-file", "t"]
    # The ingest has no flags for web clients' settings: they are left out of its command line.
    from kvgateway.config.options import CLIENT_ONLY

    clients = ["--token-file", "t", "--allow-unauthenticated", "--max-clients=5", "--allowed-origin=o", "--host", "h"]
    assert _server_argv([*argv, *clients], drop=CLIENT_ONLY) == ["--source", "name=a,endpoint=tcp://h:1", "--host", "h"]

"""The web suite's gateways and its schema check, as fixtures for every module here (defined in
:mod:`tests.support.web`, where tests/cluster/test_cluster_web.py takes them too)."""

from tests.support.web import (  # noqa: F401 - pytest collects the fixtures imported
    _every_message_follows_the_schema,
    gap_gateway,
    guarded,
    live,
    module_procs,
    recovery_window,
    serve,
)

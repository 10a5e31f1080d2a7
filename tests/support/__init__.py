"""What the tests share: free ports, the process helper, the gateway handle and waits.

One of each: tests import them from here (``from tests.support import Proc, free_ports``)."""

from tests.support.gateway import (
    STREAM_SERIES,
    Gateway,
    Start,
    metric,
    metric_values,
    proc_status,
    sim_ready,
    start_gateway,
    start_half_fleet,
    start_sim,
    wait_until,
)
from tests.support.ports import free_port, free_ports
from tests.support.processes import ARTIFACTS, REPO, SIM_READY, Proc, sim_endpoints

__all__ = [
    "ARTIFACTS",
    "REPO",
    "SIM_READY",
    "STREAM_SERIES",
    "Gateway",
    "Proc",
    "Start",
    "free_port",
    "free_ports",
    "metric",
    "metric_values",
    "proc_status",
    "sim_endpoints",
    "sim_ready",
    "start_gateway",
    "start_half_fleet",
    "start_sim",
    "wait_until",
]

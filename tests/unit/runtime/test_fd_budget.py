"""The socket and descriptor budget, and the limits derived from it."""

from __future__ import annotations

import resource

import pytest
import zmq

from kvgateway.config.settings import Settings
from kvgateway.config.sources import parse_source_flag
from kvgateway.runtime.fd_budget import (
    DESCRIPTORS_PER_STREAM,
    SOCKETS_PER_STREAM,
    Budget,
    BudgetError,
    open_context,
    raise_open_files,
    soft_limit_target,
)

INF = resource.RLIM_INFINITY


def test_the_budget_counts_three_sockets_and_four_descriptors_a_stream() -> None:
    budget = Budget(streams=2000, replays=4, clients=1000)
    assert (SOCKETS_PER_STREAM, DESCRIPTORS_PER_STREAM) == (3, 4)
    assert budget.sockets == 16 + 64 + 3 * 2000 + 4  # the base, the monitors' re-arms, 3 a stream, the replays
    assert budget.engine_descriptors == 64 + 4 * 2000 + 2 * 4
    assert budget.descriptors == budget.engine_descriptors + 1000


def test_the_budget_of_settings_counts_every_rank() -> None:
    settings = Settings(sources=(parse_source_flag("name=a,endpoint=tcp://127.0.0.1:5000,dp_size=8"),))
    budget = Budget.of(settings)
    assert budget.streams == 8
    assert (budget.replays, budget.clients) == (settings.max_concurrent_replays, settings.max_clients)


@pytest.mark.parametrize(
    ("soft", "hard", "target"),
    [
        (1024, 524288, 524288),  # the hard limit, as a server wants
        (20000, 20000, 20000),  # already there
        (1024, INF, 9072),  # unlimited hard: what the budget needs
        (50000, INF, 50000),  # never lowered
        (INF, INF, INF),
    ],
)
def test_the_soft_limit_is_raised_toward_the_hard_one(soft: int, hard: int, target: int) -> None:
    assert soft_limit_target(Budget(streams=2000, replays=4, clients=1000), soft, hard) == target


def test_a_hard_limit_below_the_streams_need_is_one_line_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 512))
    monkeypatch.setattr(resource, "setrlimit", lambda *_: None)
    with pytest.raises(BudgetError, match=r"^200 streams need 872 open files but the limit is 512 \(hard limit 512\)"):
        raise_open_files(Budget(streams=200, replays=4, clients=10))


def test_the_context_admits_the_budgets_sockets_and_never_fewer_than_zeromqs_default() -> None:
    big = open_context(Budget(streams=2000, replays=4, clients=0))
    small = open_context(Budget(streams=1, replays=4, clients=0))
    try:
        assert big.get(zmq.MAX_SOCKETS) == 16 + 64 + 3 * 2000 + 4
        assert small.get(zmq.MAX_SOCKETS) == 1023
    finally:
        big.destroy(linger=0)
        small.destroy(linger=0)


def test_more_sockets_than_libzmq_allows_is_refused_in_one_line() -> None:
    with pytest.raises(BudgetError, match=r"^30000 streams need 90084 ZeroMQ sockets but this libzmq allows \d+"):
        open_context(Budget(streams=30000, replays=4, clients=0))

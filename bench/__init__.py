"""kvgateway's benchmark suite: ``python -m bench`` (or ``make bench``).

Every scenario runs the gateway as a real process (``python -m kvgateway serve``) fed over
loopback by :mod:`bench.publisher`, a fast engine stand-in that sends pre-generated, realistic
payloads (:mod:`bench.payloads`: the simulator's workload, encoded as vLLM does). Every figure is
compared with a baseline measured in the same run, and the median of several runs is reported:
the machine may be shared, so absolute numbers are noisy and ratios are what travel.

Scenarios (one module each): :mod:`bench.ingest`, :mod:`bench.fanout` (also runs the
:mod:`bench.naive_bridge` baseline), :mod:`bench.latency`, :mod:`bench.memory`,
:mod:`bench.catchup`. Results are written as JSON under ``bench/results/`` and rendered into
``docs/performance.md`` (:mod:`bench.report`).
"""

from __future__ import annotations

RESULTS_SCHEMA = 1
"""Version of the JSON result layout; bump it when a field changes meaning."""

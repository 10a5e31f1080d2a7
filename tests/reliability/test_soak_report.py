"""The soak run's verdict and report writer (``bench/soak.py``), without running a soak: the run
itself is ``make soak``, not CI, so these keep its pure parts from rotting unnoticed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import soak


def args(**overrides: Any) -> argparse.Namespace:
    return soak.parse_args([]) if not overrides else argparse.Namespace(**{**vars(soak.parse_args([])), **overrides})


def result(
    rss: list[float], fds: list[int], *, violations: int = 0, kills: int = 2, restarts_b: int = 2
) -> dict[str, Any]:
    samples = [
        {"t": 10.0 * i, "rss_mib": r, "fds": f + 20, "fds_net": f, "threads": 3, "cpu_s": 0.3 * i, "clients": 20}
        for i, (r, f) in enumerate(zip(rss, fds, strict=True))
    ]
    return {
        "started": "2026-01-01 00:00",
        "minutes_requested": 3,
        "seconds_run": 10.0 * len(rss),
        "settings": vars(args()),
        "machine": {"cpus": 2, "load_at_end": 1.0},
        "samples": samples,
        "tally": {
            "opened": {"ws": 10, "sse": 5, "never reading": 1},
            "messages": 1000,
            "resumes": {"recovered": 3},
            "refused": {},
            "violations": [f"v{i}" for i in range(violations)],
            "reader_messages_min": 100,
        },
        "engine_b_kills": kills,
        "final_metrics": {"kvgateway_publisher_restarts_total{b}": restarts_b},
        "exit_codes": {"gateway": 0},
        "log_tracebacks": 0,
        "log_errors": 0,
    }


def test_a_flat_run_passes_and_a_growing_one_fails() -> None:
    warm = [150.0] * 6  # the first 60 s are warm-up
    flat = result([*warm, *([200.0, 201.0, 199.5] * 6)], [24] * 24)
    checks, problems = soak.verdict(flat, args())
    assert problems == [] and all(c.ok for c in checks)

    growing = result([*warm, *(200.0 + 2 * i for i in range(18))], [*([24] * 6), *(24 + i for i in range(18))])
    checks, problems = soak.verdict(growing, args())
    assert {c.name for c in checks if not c.ok} == {"RSS (MiB)", "descriptors - clients"}
    assert len(problems) == 2

    broken = result([*warm, *([200.0] * 18)], [24] * 24, violations=2, kills=3, restarts_b=2)
    _, problems = soak.verdict(broken, args())
    assert any("protocol violations" in p for p in problems)
    assert any("killed 3 times, 2 restarts" in p for p in problems)


def test_the_report_replaces_only_the_soak_section(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\nkept\n\n## Soak\n\nSTALE\n\n## Later\n\nkept too\n", encoding="utf-8")
    flat = result([150.0] * 6 + [200.0] * 18, [24] * 24)
    checks, problems = soak.verdict(flat, args())
    soak.write_section(soak.render(flat, checks, problems), doc)
    text = doc.read_text(encoding="utf-8")
    assert "STALE" not in text and "kept\n" in text and "## Later\n\nkept too\n" in text
    assert text.count("## Soak") == 1 and "**4.0 minutes actually run**" in text
    soak.write_section(soak.render(flat, checks, problems), doc)
    assert doc.read_text(encoding="utf-8") == text, "idempotent"

    fresh = tmp_path / "other.md"
    fresh.write_text("# Performance\n\nonly this\n", encoding="utf-8")
    soak.write_section("## Soak\n\nnew\n", fresh)
    assert fresh.read_text(encoding="utf-8") == "# Performance\n\nonly this\n\n## Soak\n\nnew\n"


def with_metrics(run: dict[str, Any], per_sample: list[dict[str, float]]) -> dict[str, Any]:
    for sample, metrics in zip(run["samples"], per_sample, strict=True):
        sample["metrics"] = metrics
    return run


def test_the_warm_up_lasts_until_every_bounded_structure_is_full() -> None:
    # 60 samples (600 s): the learner fills to its cap over the first 300 s, and RSS with it.
    n, cap = 60, 100_000.0
    learned = [min(cap, cap * i / 30) for i in range(n)]
    rss = [150.0 + 100.0 * min(1.0, i / 30) for i in range(n)]
    metrics = [
        {
            "kvgateway_ring_messages": 10_000.0,
            "kvgateway_learned_blocks": learned[i],
            "kvgateway_learned_blocks_cap": cap,
            "kvgateway_history_bytes": 30_000.0,
        }
        for i in range(n)
    ]
    run = with_metrics(result(rss, [24] * n), metrics)
    checks, problems = soak.verdict(run, args())
    # 95% of the cap at sample 29 (t = 290 s), not 10% of the run (60 s): the fill is not judged a leak.
    assert run["warmup_seconds"] == 290.0
    assert problems == [] and all(c.ok for c in checks)
    rows = {b["name"]: b for b in run["bounded"]}
    assert rows["learned token-chain entries"]["start"] >= 0.95 * cap
    assert rows["learned token-chain entries"]["end"] == rows["learned token-chain entries"]["bound_end"] == cap
    assert rows["resume ring (messages)"]["end"] == 10_000.0
    text = soak.render(run, checks, problems)
    assert "| learned token-chain entries | 96,667 | 100,000 | 100,000 |" in text
    assert "290 s as warm-up" in text


def test_a_table_that_settles_below_its_bound_ends_the_warm_up() -> None:
    n = 40
    tracked = [min(5_000.0, 500.0 * i) for i in range(n)]  # settles at 5,000 of 40,256
    metrics = [
        {"kvgateway_analytics_tracked_blocks": t, "kvgateway_analytics_tracked_blocks_bound": 40_256.0} for t in tracked
    ]
    run = with_metrics(result([200.0] * n, [24] * n), metrics)
    soak.verdict(run, args())
    # 5,000 from t = 100 s on; unchanged over 120 s at t = 220 s.
    assert run["warmup_seconds"] == 220.0 and run["still_filling"] == []


def test_a_structure_still_filling_is_named_and_growth_beside_it_explained() -> None:
    n = 40
    metrics = [{"kvgateway_learned_blocks": 1_000.0 * i, "kvgateway_learned_blocks_cap": 1e9} for i in range(n)]
    run = with_metrics(result([200.0 + 2 * i for i in range(n)], [24] * n), metrics)
    checks, problems = soak.verdict(run, args())
    assert run["still_filling"] == ["learned token-chain entries"]
    assert run["warmup_seconds"] == 60.0  # judged anyway after the least warm-up
    assert any(p.startswith("RSS (MiB)") for p in problems)
    assert any("learned token-chain entries 6,000 -> 39,000" in p for p in problems)
    assert "Never full nor settled in this run (judged anyway): learned token-chain entries." in soak.render(
        run, checks, problems
    )

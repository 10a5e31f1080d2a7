"""Results as Markdown: the generated section of docs/performance.md.

The section sits between two markers; everything outside them is hand-written and kept as is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

BEGIN: Final = "<!-- bench:results:begin -->"
END: Final = "<!-- bench:results:end -->"
MiB: Final = 2**20


def _num(value: Any, digits: int = 0, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int | float):
        text = f"{value:,.{digits}f}"
        return text + suffix
    return str(value)


def _mib(value: Any) -> str:
    return "n/a" if value is None else f"{value / MiB:,.1f} MiB"


def _yes(value: bool | None) -> str:
    return "n/a" if value is None else ("**yes**" if value else "**no**")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _meta(entry: dict[str, Any]) -> str:
    meta = entry.get("meta", {})
    load = meta.get("load_average_start")
    busy = meta.get("machine_busy_fraction")
    parts = [f"measured {meta.get('finished', '?')}", f"mode {meta.get('mode', '?')}", f"runs {meta.get('runs', '?')}"]
    if load:
        parts.append(f"load average at start {load[0]:.1f}")
    if busy is not None:
        parts.append(f"machine CPU busy {busy * 100:.0f}% during the scenario")
    if meta.get("seconds") is not None:
        parts.append(f"took {meta['seconds']:.0f} s")
    code = meta.get("code")
    if code:
        text = f"kvgateway {code.get('commit')}" + (" + local changes" if code.get("kvgateway_modified") else "")
        text += f" (files {code.get('digest')})"
        if code.get("changed_during_scenario"):
            text += ", CHANGED during the scenario"
        if code.get("source") and Path(code["source"]).resolve() != Path(__file__).resolve().parent.parent:
            text += " from another checkout"  # its path is a machine's, never the docs'
        parts.append(text)
    return "_" + ", ".join(parts) + "._"


# --- per scenario -------------------------------------------------------------------------


def _ingest(r: dict[str, Any]) -> list[str]:
    out = [
        f"{r['batches']:,} batches of {r['events_per_batch']} events ({r['payload_bytes']:,} bytes of msgpack "
        "on average) pre-loaded, then consumed flat out"
        + (" with one WebSocket client receiving every batch." if r.get("web_clients") else " with no web client."),
        "",
    ]
    rows = [
        [
            str(i + 1),
            _num(p["raw"]["rate"]),
            _num(p["gateway"]["rate"]),
            _num(p["ratio"], 3),
            _num(p["gateway"].get("cpu_us_per_batch"), 1),
        ]
        for i, p in enumerate(r["runs"])
    ]
    rows.append(
        [
            "**median**",
            f"**{_num(r['raw_rate'])}**",
            f"**{_num(r['gateway_rate'])}**",
            f"**{_num(r['ratio'], 3)}**",
            _num(r.get("gateway_cpu_us_per_batch"), 1),
        ]
    )
    out += _table(["run", "raw SUB batches/s", "gateway batches/s", "ratio", "gateway CPU us/batch"], rows)
    if r.get("variants"):
        out += [
            "",
            "Gateway CPU per batch (every thread, until the client has the last batch) against the floor: "
            "msgspec's decode plus JSON encode of the same payloads, in the bench process, same run. "
            "The gateway's figure is its second flood (warm: its resume ring, heap and queues grown, as in a "
            "gateway that has run a while); the first flood, into a process just started, is beside it (cold), "
            "with the page faults a batch of each; and the same gateway on the pure-Python core "
            "(`KVGATEWAY_NO_EXTENSIONS=1`: an install without a C compiler), warm:",
            "",
        ]
        out += _table(
            [
                "payloads",
                "gateway CPU us/batch",
                "floor us/batch",
                "ratio to floor",
                "gateway batches/s",
                "cold: CPU us/batch",
                "page faults a batch, warm / cold",
                "pure-Python core: CPU us/batch, ratio to floor",
            ],
            [
                [
                    name,
                    _num(v["gateway_cpu_us_per_batch"], 1),
                    _num(v["floor_us"], 1),
                    f"**{_num(v['floor_ratio'], 2)}**",
                    _num(v["gateway_rate"]),
                    _num(v.get("gateway_cold_cpu_us_per_batch"), 1),
                    f"{_num(v.get('gateway_page_faults_per_batch'), 2)} / "
                    f"{_num(v.get('gateway_cold_page_faults_per_batch'), 2)}",
                    f"{_num(v.get('pure_cpu_us_per_batch'), 1)}, {_num(v.get('pure_floor_ratio'), 2)}",
                ]
                for name, v in r["variants"].items()
            ],
        )
    b = r.get("breakdown_us")
    if b:
        out += ["", "Where a batch's time goes (in-process, same payloads, microseconds per batch):", ""]
        out += _table(list(b), [[_num(v, 1) for v in b.values()]])
    if r.get("profile"):
        out += ["", "Profile of the gateway process (py-spy, share of samples, self time):", ""]
        out += _table(["function", "self %"], [[f"`{n}`", _num(p, 1)] for n, p in r["profile"]["self_pct"][:12]])
    return out


def _fanout(kv: dict[str, Any] | None, naive: dict[str, Any] | None) -> list[str]:
    out: list[str] = []
    source = kv or naive
    assert source is not None
    pay = source.get("payload", {})
    out += [
        f"Offered rates held {source['step_seconds']:g} s each; a step passes when every client got every batch, in "
        f"order, with p99 under {source['latency_bound_ms']} ms. Payloads: {pay.get('events_per_batch')} events, "
        f"{pay.get('blocks_per_batch')} blocks, {pay.get('mean_payload_bytes')} bytes of msgpack per batch on "
        "average. CPU is the server process's (all threads), in cores.",
        "",
    ]
    rows = []
    for result in (kv or {}).get("configs", []) + (naive or {}).get("configs", []):
        if "error" in result:
            rows.append(
                [result["target"], result["transport"], str(result["clients"]), "error: " + result["error"]] + [""] * 9
            )
            continue
        rows.append(
            [
                result["target"] if result["target"] == "kvgateway" else "naive bridge",
                result["transport"].upper(),
                str(result["clients"]),
                _num(result["max_rate"]) + (" (ladder top)" if result.get("limited_by_ladder") else ""),
                f"**{_num(result['deliveries_per_s'])}**",
                ", ".join(_num(r["deliveries_per_s"]) for r in result.get("all_runs", [])) or "",
                _num(result.get("p50_ms"), 1),
                _num(result.get("p99_ms"), 1),
                _num(result.get("target_cpu_cores"), 2),
                _num(result.get("deliveries_per_cpu_second")),
                _mib(result.get("target_rss_bytes")),
                _num(result.get("client_cpu_cores"), 2),
            ]
        )
    out += _table(
        [
            "server",
            "transport",
            "clients",
            "max batches/s",
            "deliveries/s",
            "each run",
            "p50 ms",
            "p99 ms",
            "server CPU",
            "deliveries per CPU-second",
            "server RSS",
            "clients' CPU",
        ],
        rows,
    )
    for result in (kv or {}).get("configs", []):
        profile = result.get("profile")
        if profile:
            out += [
                "",
                f"Profile of the gateway during the {result['clients']} {result['transport'].upper()} clients' ladder "
                "(py-spy, share of samples, self time):",
                "",
            ]
            out += _table(["function", "self %"], [[f"`{n}`", _num(p, 1)] for n, p in profile["self_pct"][:12]])
    if kv and naive:
        out += ["", "kvgateway against the naive bridge, same harness, WebSocket:", ""]
        rows = []
        for ratio in compare(kv, naive):
            rows.append(
                [
                    str(ratio["clients"]),
                    _num(ratio["kvgateway"]),
                    _num(ratio["naive"]),
                    _num(ratio["ratio"], 2, "x"),
                    _num(ratio["kvgateway_per_cpu"]),
                    _num(ratio["naive_per_cpu"]),
                ]
            )
        out += _table(
            [
                "clients",
                "kvgateway deliveries/s",
                "naive deliveries/s",
                "ratio",
                "kvgateway per CPU-second",
                "naive per CPU-second",
            ],
            rows,
        )
    return out


def compare(kv: dict[str, Any], naive: dict[str, Any]) -> list[dict[str, Any]]:
    """kvgateway's WebSocket figures over the naive bridge's, per client count."""
    by_clients = {c["clients"]: c for c in naive.get("configs", []) if c["transport"] == "ws" and "error" not in c}
    out = []
    for config in kv.get("configs", []):
        other = by_clients.get(config["clients"])
        if config["transport"] != "ws" or other is None or "error" in config:
            continue
        ratio = config["deliveries_per_s"] / other["deliveries_per_s"] if other["deliveries_per_s"] else None
        out.append(
            {
                "clients": config["clients"],
                "kvgateway": config["deliveries_per_s"],
                "naive": other["deliveries_per_s"],
                "ratio": ratio,
                "kvgateway_per_cpu": config.get("deliveries_per_cpu_second"),
                "naive_per_cpu": other.get("deliveries_per_cpu_second"),
            }
        )
    return out


def _latency(r: dict[str, Any]) -> list[str]:
    out = [
        f"{r['rate']:g} batches/s for {r['seconds']:g} s to {r['clients']} WebSocket clients; every delivery counted.",
        "",
    ]
    rows = []
    for name, key in (("kvgateway", "kvgateway"), ("naive bridge", "naive")):
        f = r[key]
        rows.append(
            [
                name,
                _num(f["p50_ms"], 2),
                _num(f["p99_ms"], 2),
                _num(f["p999_ms"], 2),
                _num(f["max_ms"], 1),
                _num(f["target_cpu_cores"], 2),
            ]
        )
    ratio = r["ratio_to_naive"]
    rows.append(
        ["ratio", _num(ratio["p50_ms"], 2, "x"), _num(ratio["p99_ms"], 2, "x"), _num(ratio["p999_ms"], 2, "x"), "", ""]
    )
    out += _table(["server", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "server CPU"], rows)
    return out


def _memory(r: dict[str, Any]) -> list[str]:
    t = r["tracemalloc"]
    out = [
        f"Index filled to {r['resident_blocks']:,} resident blocks (8 streams, 16-token blocks, u64 hashes), "
        "resume ring cut to 100 messages:",
        "",
    ]
    rows = [
        [
            str(i + 1),
            _num(f["resident_blocks"]),
            _mib(f["rss_start_bytes"]),
            _mib(f["rss_end_bytes"]),
            _num(f["bytes_per_block"], 1),
            _num(f.get("defaults_bytes_per_block"), 1),
            _num(f["fill_seconds"], 1),
        ]
        for i, f in enumerate(r["fills"])
    ]
    rows.append(
        [
            "**median**",
            "",
            "",
            "",
            f"**{_num(r['bytes_per_block'], 1)}**",
            _num(r.get("defaults_bytes_per_block"), 1),
            "",
        ]
    )
    out += _table(
        [
            "run",
            "resident blocks",
            "RSS idle",
            "RSS filled",
            "RSS bytes/block, the index",
            "the same, learner on (defaults)",
            "fill s",
        ],
        rows,
    )
    out += [
        "",
        f"In-process (tracemalloc), same batches: the index takes **{_num(t['index_bytes_per_block'], 1)} bytes per "
        f"block**; a plain Python `set` per stream of the same hashes takes {_num(t['plain_set_bytes_per_block'], 1)} "
        f"(ratio {_num(r.get('ratio_to_plain_set'), 2)}).",
        "",
    ]
    c = r["churn"]
    out += [
        f"Churn: {c['rate']:g} batches/s for {c['seconds']:g} s with {c['clients']} WebSocket clients, default "
        "settings (ring 10,000 messages / 64 MiB):",
        "",
    ]
    out += _table(
        [
            "RSS idle",
            f"RSS at {c['early_at_seconds']:g} s",
            f"RSS at {c['seconds']:g} s",
            "max",
            "end / early",
            "learned entries, early -> end",
            "end / early, net of the learner",
            "ring bytes at end",
            "every batch delivered",
        ],
        [
            [
                _mib(c["rss_idle_bytes"]),
                _mib(c["rss_early_bytes"]),
                _mib(c["rss_end_bytes"]),
                _mib(c["rss_max_bytes"]),
                _num(c["growth_ratio"], 3),
                f"{_num(c.get('learned_early'))} -> {_num(c.get('learned_end'))}",
                f"**{_num(c.get('growth_ratio_net_of_learner'), 3)}**",
                _mib(c.get("ring_bytes")),
                _yes(c.get("all_delivered")),
            ]
        ],
    )
    if c.get("learner_bytes_per_entry") is not None:
        out += [
            "",
            "The routers' chain learner keeps an entry per announced block up to its cap (1.25 per resident "
            f"block of the fleet, at least 65,536), about {_num(c['learner_bytes_per_entry'], 1)} bytes of RSS each "
            "(the two fills above): the RSS it adds while it fills is a bounded cache growing, so flatness is "
            "judged net of it.",
        ]
    if c.get("bounded"):
        out += [
            "",
            *_table(
                ["bounded structure", "early", "end", "bound at the end"],
                [[b["name"], _num(b["start"]), _num(b["end"]), _num(b.get("bound_end"))] for b in c["bounded"]],
            ),
        ]
    return out


def _catchup(r: dict[str, Any]) -> list[str]:
    out = [
        f"The engine holds {r['batches']:,} batches in its replay buffer when the gateway starts. Times in seconds.",
        "",
    ]
    rows = []
    for i, p in enumerate(r["runs"]):
        g, raw = p["gateway"], p["raw"]
        rows.append(
            [
                str(i + 1),
                _num(g["replay_request_seconds"], 3),
                _num(g["replay_phase_seconds"], 3),
                _num(g["total_seconds"], 3),
                _num(raw["fetch_seconds"], 3),
                _num(raw["total_seconds"], 3),
                _num(p["ratio_total"], 2, "x"),
                _yes(g["occupancy"] == g["expected"]),
            ]
        )
    rows.append(
        [
            "**median**",
            _num(r["gateway_startup_seconds"], 3),
            _num(r["gateway_replay_phase_seconds"], 3),
            f"**{_num(r['gateway_total_seconds'], 3)}**",
            _num(r["raw_fetch_seconds"], 3),
            _num(r["raw_total_seconds"], 3),
            f"**{_num(r['ratio_total'], 2, 'x')}**",
            _yes(r["rebuilt_exactly"]),
        ]
    )
    out += _table(
        [
            "run",
            "gateway: spawn to replay request",
            "gateway: replay to rebuilt index",
            "gateway: total",
            "raw DEALER: fetch",
            "raw DEALER: spawn to end",
            "total ratio",
            "index exact",
        ],
        rows,
    )
    return out


def _streams(r: dict[str, Any]) -> list[str]:
    out = [
        "N streams against closed loopback ports (no engine running: every stream connecting and "
        "retrying), against one stream in the same run; per stream = (N - one) / (N - 1).",
        "",
    ]
    rows = []
    for row in r["sizes"]:
        one, per = row["one_stream"], row["per_stream"]
        rows.append(
            [
                _num(row["streams"]),
                _num(row["start_seconds"], 2),
                _num(row["idle_cpu_cores"] * 100, 2) + "%",
                _mib(row["rss_bytes"]),
                _num(row["descriptors"]),
                _num(row["metrics_seconds"] * 1000, 0) + " ms",
                _num(row["metrics_bytes"] / 1024, 0) + " KiB",
                f"{_num(per['rss_bytes'] / 1024, 1)} KiB, {_num(per['descriptors'], 2)} fds, "
                f"{_num(per['metrics_bytes'], 0)} B of /metrics",
                f"{_num(one['idle_cpu_cores'] * 100, 2)}%, {_mib(one['rss_bytes'])}, {_num(one['descriptors'])} fds",
            ]
        )
    out += _table(
        [
            "streams",
            "spawn to listed, s",
            "idle CPU",
            "RSS",
            "descriptors",
            "/metrics scrape",
            "/metrics size",
            "per stream",
            "one stream",
        ],
        rows,
    )
    return out


# --- the whole section --------------------------------------------------------------------


def _floor_row(r: dict[str, Any]) -> list[str]:
    return [
        "1 ingest CPU per batch, 1 WS client",
        f"{_num(r['gateway_cpu_us_per_batch'], 1)} us",
        f"floor {_num(r['floor_us'], 1)} us",
        _num(r["floor_ratio"], 2),
        "<= 2.0 x the floor",
        _yes(r["floor_ratio"] <= 2.0),
    ]


def _streams_row(big: dict[str, Any]) -> list[str]:
    return [
        f"7 {int(big['streams']):,} streams, engines down",
        f"start {_num(big['start_seconds'], 2)} s, idle {_num(big['idle_cpu_cores'] * 100, 1)}% of a core, "
        f"/metrics {_num(big['metrics_seconds'], 2)} s",
        "",
        "",
        "start in seconds, idle < 5%, /metrics < 1 s",
        _yes(big["idle_cpu_cores"] < 0.05 and big["metrics_seconds"] < 1.0),
    ]


def _targets(s: dict[str, Any]) -> list[str]:
    rows: list[list[str]] = []

    def result(name: str) -> dict[str, Any] | None:
        entry = s.get(name)
        return None if entry is None or "error" in entry else entry["result"]

    if (r := result("ingest")) is not None and r.get("floor_ratio") is not None:
        rows.append(_floor_row(r))
    if (r := result("ingest")) is not None:
        rows.append(
            [
                "1 ingest ceiling",
                f"{_num(r['gateway_rate'])} batches/s",
                f"raw SUB {_num(r['raw_rate'])} batches/s",
                _num(r["ratio"], 3),
                f">= {r.get('target_ratio', 0.25)} of raw",
                _yes(r["ratio"] >= r.get("target_ratio", 0.25)),
            ]
        )
    kv, naive = result("fanout"), result("naive")
    if kv is not None:
        for config in kv["configs"]:
            if config["transport"] == "ws" and config["clients"] == 100 and "error" not in config:
                per_cpu = config.get("deliveries_per_cpu_second")
                rows.append(
                    [
                        "2 fan-out, 100 WebSocket clients",
                        f"{_num(config['deliveries_per_s'])} deliveries/s at {_num(config['target_cpu_cores'], 2)} "
                        "cores",
                        "",
                        f"{_num(per_cpu)} per CPU-second",
                        ">= 100,000 deliveries/s on one core",
                        _yes(config["deliveries_per_s"] >= 100_000 and (config["target_cpu_cores"] or 0) <= 1.0),
                    ]
                )
    if kv is not None and naive is not None:
        ratios = compare(kv, naive)
        if ratios:
            worst = min(ratios, key=lambda x: x["ratio"] or 0)
            rows.append(
                [
                    "3 against the naive bridge",
                    ", ".join(f"{x['clients']}: {_num(x['kvgateway'])}" for x in ratios),
                    "naive " + ", ".join(f"{x['clients']}: {_num(x['naive'])}" for x in ratios),
                    f"{_num(worst['ratio'], 2)}x at worst ({worst['clients']} client"
                    + ("s)" if worst["clients"] != 1 else ")"),
                    "beats it",
                    _yes(all((x["ratio"] or 0) > 1 for x in ratios)),
                ]
            )
    if (r := result("latency")) is not None:
        g, n = r["kvgateway"], r["naive"]
        rows.append(
            [
                f"4 latency, {r['rate']:g}/s, {r['clients']} clients",
                f"p50 {_num(g['p50_ms'], 2)} / p99 {_num(g['p99_ms'], 2)} / p99.9 {_num(g['p999_ms'], 2)} ms",
                f"naive {_num(n['p50_ms'], 2)} / {_num(n['p99_ms'], 2)} / {_num(n['p999_ms'], 2)} ms",
                f"p99 {_num(r['ratio_to_naive']['p99_ms'], 2)}x",
                "reported",
                "",
            ]
        )
    if (r := result("memory")) is not None:
        t = r["tracemalloc"]
        rows.append(
            [
                "5 index memory",
                f"{_num(r['bytes_per_block'], 1)} B/block (RSS), {_num(t['index_bytes_per_block'], 1)} (tracemalloc); "
                f"{_num(r.get('defaults_bytes_per_block'), 1)} with the chain learner on",
                f"plain set {_num(t['plain_set_bytes_per_block'], 1)} B/block",
                _num(r.get("ratio_to_plain_set"), 2),
                "reported",
                "",
            ]
        )
        c = r["churn"]
        net = c.get("growth_ratio_net_of_learner", c["growth_ratio"])
        rows.append(
            [
                "5 RSS under churn",
                f"{_mib(c['rss_end_bytes'])} after {c['seconds']:g} s",
                f"{_mib(c['rss_early_bytes'])} after {c['early_at_seconds']:g} s",
                f"{_num(c['growth_ratio'], 3)}; {_num(net, 3)} net of the learner",
                "flat (net of the learner's bounded map)",
                _yes(net <= 1.05),
            ]
        )
    if (r := result("catchup")) is not None:
        rows.append(
            [
                f"6 catch-up, {r['batches']:,} batches",
                f"{_num(r['gateway_total_seconds'], 3)} s to an exact index",
                f"raw DEALER {_num(r['raw_total_seconds'], 3)} s",
                f"{_num(r['ratio_total'], 2)}x",
                "reported",
                _yes(r["rebuilt_exactly"]),
            ]
        )
    if (r := result("streams")) is not None and r["sizes"]:
        rows.append(_streams_row(r["sizes"][-1]))
    return _table(["scenario", "kvgateway", "baseline", "ratio", "target", "met"], rows)


SECTIONS: Final[list[tuple[str, str, Callable[[dict[str, Any]], list[str]]]]] = [
    ("ingest", "1. Ingest ceiling", _ingest),
    ("latency", "4. Latency at 1,000 batches/s", _latency),
    ("memory", "5. Index memory and churn", _memory),
    ("catchup", "6. Catch-up from a replay", _catchup),
    ("streams", "7. Many streams", _streams),
]


def render(merged: dict[str, Any]) -> str:
    machine = merged.get("machine", {})
    scenarios: dict[str, Any] = merged.get("scenarios", {})
    versions = machine.get("versions", {})
    lines = [
        BEGIN,
        "",
        "_Generated by `python -m bench` (full runs keep the newest result of each scenario in "
        "`bench/results/latest.json`); do not edit between these markers._",
        "",
        "### Machine",
        "",
    ]
    lines += _table(
        ["CPUs", "CPU model", "memory", "Python", "commit", "load average at start"],
        [
            [
                str(machine.get("cpus")),
                str(machine.get("cpu_model")),
                f"{machine.get('memory_bytes', 0) / 2**30:.1f} GiB",
                f"{machine.get('implementation', '')} {machine.get('python', '')}",
                str(machine.get("commit")),
                " / ".join(f"{x:.1f}" for x in machine.get("load_average", [])),
            ]
        ],
    )
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".", ""]
    lines += ["### Targets", ""]
    lines += _targets(scenarios)
    for key, title, body in SECTIONS[:1]:
        lines += _section(scenarios, key, title, body)
    if "fanout" in scenarios or "naive" in scenarios:
        kv = scenarios.get("fanout")
        naive = scenarios.get("naive")
        lines += ["", "### 2-3. Fan-out, and the naive bridge", ""]
        for name, entry in (("kvgateway", kv), ("naive bridge", naive)):
            if entry is not None:
                lines += [f"{name}: {_meta(entry)}", ""]
        usable = [e for e in (kv, naive) if e is not None and "error" not in e]
        if usable:
            lines += _fanout(
                kv["result"] if kv and "error" not in kv else None,
                naive["result"] if naive and "error" not in naive else None,
            )
        for entry in (kv, naive):
            if entry is not None and "error" in entry:
                lines += ["", f"Failed: {entry['error']}"]
    for key, title, body in SECTIONS[1:]:
        lines += _section(scenarios, key, title, body)
    lines += ["", END]
    return "\n".join(lines)


def _section(scenarios: dict[str, Any], key: str, title: str, body: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    entry = scenarios.get(key)
    if entry is None:
        return []
    lines = ["", f"### {title}", "", _meta(entry), ""]
    if "error" in entry:
        return [*lines, f"Failed: {entry['error']}"]
    return lines + body(entry["result"])


def update_doc(path: Path, section: str) -> None:
    """Replace the text between the markers (or append the section when they are missing)."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Performance\n\n## Results\n\n"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    found = pattern.search(text) is not None
    text = pattern.sub(lambda _: section, text) if found else text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")

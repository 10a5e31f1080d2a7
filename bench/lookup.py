"""Lookup, snapshot and learned-chain memory, in process: ``python -m bench.lookup [--smoke]``.

Not (yet) a scenario of ``python -m bench``: everything here runs in this process against the
sans-I/O modules (kvgateway.state.occupancy, kvgateway.state.blocks, kvgateway.state.lookup). The end-to-end
figures (live clients' p99 while the real web stack serves a snapshot) are bench/snapshot.py's.

Workload: ``--streams`` engines (8) hold ``--blocks`` resident blocks in all (1,000,000) as
chains of ``--chain`` blocks (64) of 16 random tokens each. Every engine hashes with its own seed,
as vLLM does without PYTHONHASHSEED, so no chain is shared between streams; blocks are announced
one chain per BlockStored with real token_ids, as vLLM announces them.

Figures:

- **lookup**: p50/p99 latency and lookups/s of a lookup over every stream, by hashes (the parsed
  chain; and from the JSON body, parsing included) and by tokens, for queries that hit one stream
  for a whole chain, half a chain, or nothing. The baseline is the least Python can do: a walk of
  plain ``set`` / ``dict`` objects (a set of hashes per stream; a dict "(parent, tokens tuple) ->
  hash" per stream) in the same process.
- **memory** (tracemalloc): bytes per resident block of the occupancy index alone (learning off),
  and of index + learner (on), and the learner's bytes per learned block. The hash int objects
  (32-36 bytes each) are made with the events, before tracing: they count in neither figure (the
  index and the learner share them while the block is resident; a learned block no longer
  resident keeps its int alive).
- **learn**: microseconds of learning per announced block (the ingest path's extra cost).
- **snapshot**: capture (freeze) time, the whole rendering of ``state`` messages to JSON bytes in
  chunks of 1,000 blocks, the longest chunk (the longest the event loop would wait for it), and
  the copy-on-write cost paid by the first apply to a frozen stream.
- **fleet**: :func:`kvgateway.state.lookup.fleet_facts` over the whole fleet (counted in steps), and
  the same from the index's fleet holders, as the gateway counts a fleet of one medium and group.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec

from bench.common import BenchError, write_run
from kvgateway.engine.wire import Batch, BlockStored, Hash
from kvgateway.state.blocks import DEFAULT_CHUNK_BLOCKS, capture, state_messages
from kvgateway.state.lookup import (
    ChainLearner,
    FleetCount,
    TokenQuery,
    fleet_facts,
    lookup_hashes,
    lookup_tokens,
    parse_request,
)
from kvgateway.state.occupancy import OccupancyIndex

REPO: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = REPO / "bench" / "results" / "lookup"
BLOCK_SIZE: Final = 16
VOCAB: Final = 151_000
GOAL_P99_MS: Final = 1.0


def _say(text: str) -> None:
    print(f"[bench.lookup] {text}", file=sys.stderr, flush=True)


def _engine_hash(seed: bytes, parent: int | None, tokens: list[int]) -> int:
    """A stand-in for an engine's chained hash (the gateway never needs to know it)."""
    data = seed + (b"" if parent is None else parent.to_bytes(8, "big")) + msgspec.msgpack.encode(tokens)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Workload:
    """The chains, generated on the fly; only the query samples are kept."""

    def __init__(self, streams: int, blocks: int, chain: int, samples: int, seed: int = 7) -> None:
        self.streams = streams
        self.chain = chain
        self.chains_per_stream = max(1, blocks // (streams * chain))
        self.rng = random.Random(seed)
        self.samples: list[tuple[int, list[int], list[int]]] = []  # (stream, tokens, hashes)
        self.sample_every = max(1, self.chains_per_stream * streams // samples)

    def events(self) -> Any:
        """(stream, BlockStored) for every chain, streams interleaved."""
        n = 0
        for _ in range(self.chains_per_stream):
            for stream in range(self.streams):
                seed = f"engine-{stream}".encode()
                tokens = [self.rng.randrange(VOCAB) for _ in range(self.chain * BLOCK_SIZE)]
                hashes: list[Hash] = []
                parent: int | None = None
                for i in range(self.chain):
                    parent = _engine_hash(seed, parent, tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
                    hashes.append(parent)
                if n % self.sample_every == 0:
                    self.samples.append((stream, tokens, [int(h) for h in hashes]))
                n += 1
                yield stream, BlockStored(hashes, None, tokens, BLOCK_SIZE, None, "GPU", None, {"extra_keys": None})


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(ordered[len(ordered) // 2] * 1e3, 4),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 4),
        "max_ms": round(ordered[-1] * 1e3, 4),
        "per_s": round(len(ordered) / sum(ordered), 1),
    }


def _timed(fn: Callable[[Any], Any], args: list[Any], rounds: int) -> dict[str, float]:
    times = []
    clock = time.perf_counter
    for _ in range(rounds):
        for arg in args:
            start = clock()
            fn(arg)
            times.append(clock() - start)
    return _percentiles(times)


def run(streams: int, blocks: int, chain: int, queries: int, rounds: int) -> dict[str, Any]:
    work = Workload(streams, blocks, chain, samples=queries)
    occupancy = OccupancyIndex()
    for s in range(streams):
        occupancy.stream("engine", s)

    # --- build, learning off, index memory traced -----------------------------------------
    _say(f"building {streams} streams x {work.chains_per_stream} chains x {chain} blocks (learning off)")
    events = list(work.events())
    resident = sum(len(e.block_hashes) for _, e in events)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for stream, event in events:
        occupancy.apply("engine", stream, Batch(0.0, [event], stream), 0.0)
    gc.collect()
    index_bytes = tracemalloc.get_traced_memory()[0] - base
    # --- learning on: the learner's own memory -------------------------------------------
    learner = ChainLearner(max_blocks=max(2 * resident, 1), floor=max(2 * resident, 1))  # all learned
    base = tracemalloc.get_traced_memory()[0]
    for stream, event in events:
        learner.learn("engine", stream, event)
    gc.collect()
    learner_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    # Learning cost, untraced: a second learner over the same events.
    timing = ChainLearner(max_blocks=max(2 * resident, 1), floor=max(2 * resident, 1))
    start = time.perf_counter()
    for stream, event in events:
        timing.learn("engine", stream, event)
    learn_us = (time.perf_counter() - start) / resident * 1e6
    del timing
    _say(f"{resident} resident blocks; learned {len(learner)}")

    # Baselines: plain sets of hashes and plain dicts "(parent, tokens tuple) -> hash".
    plain_sets: list[set[Hash]] = [set() for _ in range(streams)]
    plain_chains: list[dict[tuple[Hash | None, tuple[int, ...]], Hash]] = [{} for _ in range(streams)]
    for stream, event in events:
        plain_sets[stream].update(event.block_hashes)
        parent: Hash | None = None
        for i, h in enumerate(event.block_hashes):
            plain_chains[stream][(parent, tuple(event.token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]))] = h
            parent = h
    del events
    gc.collect()

    indexes = list(occupancy.streams())
    rng = random.Random(11)
    hash_queries: list[list[tuple[Hash, ...]]] = []
    token_queries: list[list[int]] = []
    bodies: list[bytes] = []
    for i, (_stream, sample_tokens, sample_hashes) in enumerate(work.samples):
        tokens, hashes = sample_tokens, sample_hashes
        kind = i % 3  # a whole chain, half a chain then a miss, a miss
        if kind == 1:
            cut = chain // 2
            hashes = hashes[:cut] + [rng.getrandbits(64) for _ in range(chain - cut)]
            tokens = tokens[: cut * BLOCK_SIZE] + [rng.randrange(VOCAB) for _ in range((chain - cut) * BLOCK_SIZE)]
        elif kind == 2:
            hashes = [rng.getrandbits(64) for _ in range(chain)]
            tokens = [rng.randrange(VOCAB) for _ in range(chain * BLOCK_SIZE)]
        hash_queries.append([(h,) for h in hashes])
        token_queries.append(tokens)
        bodies.append(json.dumps({"block_hashes": [str(h) for h in hashes]}).encode())

    def baseline_hashes(query: list[tuple[Hash, ...]]) -> list[int]:
        out = []
        for held in plain_sets:
            n = 0
            for (h,) in query:
                if h not in held:
                    break
                n += 1
            out.append(n)
        return sorted(out, reverse=True)

    def baseline_tokens(tokens: list[int]) -> list[int]:
        out = []
        for learned, held in zip(plain_chains, plain_sets, strict=True):
            n = 0
            parent: Hash | None = None
            for i in range(len(tokens) // BLOCK_SIZE):
                h = learned.get((parent, tuple(tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])))
                if h is None or h not in held:
                    break
                n += 1
                parent = h
            out.append(n)
        return sorted(out, reverse=True)

    # Same answers as the baselines (blocks per stream, sorted), before timing anything.
    for query, tokens in zip(hash_queries, token_queries, strict=True):
        by_hashes = [s["blocks"] for s in lookup_hashes(indexes, query, 0)["streams"]]
        by_tokens = [s["blocks"] for s in lookup_tokens(indexes, learner, TokenQuery(tokens), 0)["streams"]]
        if not by_hashes == by_tokens == baseline_hashes(query) == baseline_tokens(tokens):
            raise SystemExit("lookup answers differ from the baseline")

    _say(f"timing {len(hash_queries)} queries x {rounds} rounds")
    lookup = {
        "queries": len(hash_queries),
        "rounds": rounds,
        "by_hashes": _timed(lambda q: lookup_hashes(indexes, q, 0), hash_queries, rounds),
        "by_hashes_with_parsing": _timed(
            lambda b: lookup_hashes(indexes, parse_request(b).chain, 0),  # type: ignore[union-attr]
            bodies,
            rounds,
        ),
        "by_tokens": _timed(lambda t: lookup_tokens(indexes, learner, TokenQuery(t), 0), token_queries, rounds),
        "baseline_by_hashes": _timed(baseline_hashes, hash_queries, rounds),
        "baseline_by_tokens": _timed(baseline_tokens, token_queries, rounds),
        "goal_p99_ms": GOAL_P99_MS,
    }

    # --- snapshot -------------------------------------------------------------------------
    encode = msgspec.json.Encoder().encode
    start = time.perf_counter()
    frozen = capture(indexes)
    capture_s = time.perf_counter() - start
    chunk_times = []
    total_bytes = 0
    clock = time.perf_counter
    messages = state_messages(frozen, 1, DEFAULT_CHUNK_BLOCKS)
    start = clock()
    while True:
        step = clock()
        message = next(messages, None)
        if message is None:
            break
        total_bytes += len(encode(message))
        chunk_times.append(clock() - step)
    render_s = clock() - start
    probe = Batch(0.0, [BlockStored([1], None, [0] * BLOCK_SIZE, BLOCK_SIZE, None, "GPU")], 0)
    start = clock()
    occupancy.apply("engine", 0, probe, 0.0)  # the first change to a frozen stream copies its group
    cow_s = clock() - start
    start = clock()
    occupancy.apply("engine", 0, probe, 0.0)
    second_s = clock() - start
    snapshot = {
        "blocks": sum(s.count for s in frozen),
        "capture_ms": round(capture_s * 1e3, 3),
        "render_s": round(render_s, 3),
        "json_bytes": total_bytes,
        "chunks": len(chunk_times),
        "chunk_blocks": DEFAULT_CHUNK_BLOCKS,
        "chunk_p99_ms": round(sorted(chunk_times)[int(len(chunk_times) * 0.99)] * 1e3, 3),
        "chunk_max_ms": round(max(chunk_times) * 1e3, 3),
        "copy_on_write_first_apply_ms": round(cow_s * 1e3, 3),
        "blocks_copied": resident // streams,
        "next_apply_ms": round(second_s * 1e3, 4),
    }
    del frozen, messages

    start = time.perf_counter()
    facts = fleet_facts(indexes)
    stepped_s = time.perf_counter() - start
    start = time.perf_counter()
    tallied = FleetCount(indexes, holders=occupancy).result()  # as the gateway counts: one medium and group
    tallied_s = time.perf_counter() - start
    if tallied != facts:
        raise BenchError(f"the fleet count from the holders {tallied} is not the count in steps {facts}")
    fleet = {"seconds": round(stepped_s, 3), "from_holders_ms": round(tallied_s * 1e3, 3), "facts": facts}

    return {
        "workload": {
            "streams": streams,
            "resident_blocks": resident,
            "chain_blocks": chain,
            "block_size": BLOCK_SIZE,
            "chains_per_stream": work.chains_per_stream,
        },
        "lookup": lookup,
        "memory": {
            "index_bytes_per_resident_block": round(index_bytes / resident, 1),
            "learner_bytes_per_learned_block": round(learner_bytes / max(1, len(learner)), 1),
            "learned_blocks": len(learner),
            "bytes_per_resident_block_learning_off": round(index_bytes / resident, 1),
            "bytes_per_resident_block_learning_on": round((index_bytes + learner_bytes) / resident, 1),
        },
        "learn_us_per_block": round(learn_us, 3),
        "snapshot": snapshot,
        "fleet": fleet,
    }


def _commit() -> str | None:
    import subprocess

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)

    try:
        out = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "kvgateway")
    except OSError:
        return None
    return out.stdout.strip() + (" + local changes" if dirty.stdout.strip() else "") if out.returncode == 0 else None


def workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's options (shared with bench/learner.py)."""
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): proves it works, means nothing")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--blocks", type=int, help="resident blocks in all (default 1,000,000; smoke 4,096)")
    parser.add_argument("--chain", type=int, default=64, help="blocks per chain")
    parser.add_argument("--queries", type=int, help="distinct queries (default 300; smoke 12)")
    parser.add_argument("--rounds", type=int, help="passes over the queries (default 10; smoke 1)")


def workload_sizes(args: argparse.Namespace) -> tuple[int, int, int]:
    """(blocks, queries, rounds) from :func:`workload_arguments`' options and their defaults."""
    blocks = args.blocks or (4096 if args.smoke else 1_000_000)
    queries = args.queries or (12 if args.smoke else 300)
    rounds = args.rounds or (1 if args.smoke else 10)
    return blocks, queries, rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lookup", description=__doc__.split("\n\n")[0])
    workload_arguments(parser)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    blocks, queries, rounds = workload_sizes(args)
    if min(args.streams, blocks, args.chain, queries, rounds) < 1:
        parser.error("sizes must be at least 1")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    result = run(args.streams, blocks, args.chain, queries, rounds)
    out = {
        "mode": "smoke" if args.smoke else "full",
        "started": started,
        "code": _commit(),
        "python": sys.version.split()[0],
        **result,
    }
    _say(f"wrote {write_run(out, args.results_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The baselines: what plain pyzmq does with the same stream, in a process of its own.

``python -m bench.raw sub --endpoint E --count N``: a SUB loop that only receives N messages and
prints the wall-clock times of the first and the last (the ingest ceiling's baseline).

``python -m bench.raw dealer --endpoint R --start S``: a DEALER that fetches a replay from seq S to
the end marker and prints when it connected, asked and got the end (the catch-up baseline).

Each prints one JSON line on stdout when done.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import zmq

from bench.common import TOPIC
from kvgateway.engine import wire


def sub(endpoint: str, count: int) -> dict[str, object]:
    context = zmq.Context()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sock.connect(endpoint)
    frames = sock.recv_multipart()
    first = time.time()
    last_seq = int.from_bytes(frames[1], "big")
    for _ in range(count - 1):
        frames = sock.recv_multipart()
    last = time.time()
    last_seq = int.from_bytes(frames[1], "big")
    sock.close(linger=0)
    context.term()
    return {"first": first, "last": last, "count": count, "last_seq": last_seq}


def dealer(endpoint: str, start: int) -> dict[str, object]:
    t_process = time.time()
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    t_sent = time.time()
    sock.send_multipart([b"", wire.seq_bytes(start)])
    items = 0
    first_seq = last_seq = None
    while True:
        frames = sock.recv_multipart()
        seq_frame = frames[-2]
        if seq_frame == wire.END_SEQ_BYTES:
            break
        seq = int.from_bytes(seq_frame, "big")
        first_seq = seq if first_seq is None else first_seq
        last_seq = seq
        items += 1
    t_end = time.time()
    sock.close(linger=0)
    context.term()
    return {
        "process_start": t_process,
        "sent": t_sent,
        "end": t_end,
        "items": items,
        "first_seq": first_seq,
        "last_seq": last_seq,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raw")
    sub_parsers = parser.add_subparsers(dest="mode", required=True)
    p_sub = sub_parsers.add_parser("sub")
    p_sub.add_argument("--endpoint", required=True)
    p_sub.add_argument("--count", type=int, required=True)
    p_dealer = sub_parsers.add_parser("dealer")
    p_dealer.add_argument("--endpoint", required=True)
    p_dealer.add_argument("--start", type=int, default=0)
    args = parser.parse_args(argv)
    result = sub(args.endpoint, args.count) if args.mode == "sub" else dealer(args.endpoint, args.start)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

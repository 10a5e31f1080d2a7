"""kvgateway.cluster.shards: the plan each ingest process makes from the leases it sees (no I/O)."""

from __future__ import annotations

from kvgateway.cluster.shards import member_key, plan, stream_key

KEYS = [stream_key(("e", rank)) for rank in range(4)]


def test_a_lone_process_takes_every_stream() -> None:
    step = plan(KEYS, {}, "a")
    assert (step.fair, step.keep, step.give_back, step.take) == (4, [], [], KEYS)


def test_a_second_member_makes_the_first_give_back_half_and_takes_it() -> None:
    holders = {member_key("a"): "a", member_key("b"): "b", **dict.fromkeys(KEYS, "a")}
    first = plan(KEYS, holders, "a")
    assert (first.fair, first.keep, first.give_back, first.take) == (2, KEYS[:2], KEYS[2:], [])
    after = {member_key("a"): "a", member_key("b"): "b", KEYS[0]: "a", KEYS[1]: "a"}
    second = plan(KEYS, after, "b")
    assert (second.fair, second.keep, second.take) == (2, [], KEYS[2:])


def test_streams_of_a_member_whose_leases_ran_out_are_free_and_the_share_rounds_up() -> None:
    holders = {member_key("a"): "a", KEYS[0]: "a"}  # b's presence and leases ran out: not listed
    step = plan(KEYS, holders, "a")
    assert (step.fair, step.keep, step.take) == (4, [KEYS[0]], KEYS[1:])
    three = {member_key(m): m for m in "abc"}
    assert plan(KEYS, three, "c").fair == 2, "4 streams over 3 members: 2 at most each"
    assert plan([], {}, "a").fair == 0


def test_member_keys_are_valid_key_value_keys() -> None:
    assert member_key("host.example-1:42") == "member.host_example-1_42"
    assert stream_key(("a b", 3)).startswith("stream.x") and stream_key(("vllm", 3)) == "stream.vllm.3"

"""kvgateway.config.arguments: each command's flags are made from the option table, as its option
set says."""

from __future__ import annotations

import argparse

import pytest

from kvgateway import cli
from kvgateway.cli import SERVE
from kvgateway.cluster.commands import EDGE, INGEST
from kvgateway.config.arguments import add_arguments, flag_names
from kvgateway.config.options import CLIENT_ONLY, NATS_KEYS, OPTIONS, SERVER_KEYS, OptionSet
from kvgateway.demo import DEMO
from tests.support.command_line import parse


def _flags(*argv: str) -> set[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return flag_names(sub.choices[argv[0]])


@pytest.mark.parametrize(("command", "takes"), [("serve", SERVE), ("ingest", INGEST), ("edge", EDGE), ("demo", DEMO)])
def test_each_command_has_the_flags_of_the_options_it_takes_and_no_other(command: str, takes: OptionSet) -> None:
    flags = _flags(command)
    for option in OPTIONS:
        assert (option.flag_name in flags) is takes.takes(option), (command, option.key)
    assert ({"--config", "--source"} <= flags) is takes.sources


def test_what_each_command_takes() -> None:
    """serve: every [server] setting and --workers'; ingest: no web client's, and NATS; edge: all."""
    assert set(SERVE.keys) == {*SERVER_KEYS, "workers", "nats", "state_dir"}
    assert set(INGEST.keys) == set(SERVER_KEYS) - CLIENT_ONLY | set(NATS_KEYS)
    assert set(EDGE.keys) == {*SERVER_KEYS, *NATS_KEYS} and set(DEMO.keys) == set(SERVER_KEYS)
    assert not INGEST.clients and INGEST.needs_sources and INGEST.needs_nats and EDGE.needs_nats


def test_no_flag_has_a_default() -> None:
    """None is "not given": the environment and the file are looked at next."""
    args = vars(parse(EDGE))
    assert all(args[option.dest] is None for option in EDGE.options())
    assert args["config"] is None and args["source"] is None


def test_the_help_groups_and_words() -> None:
    parser = argparse.ArgumentParser(formatter_class=lambda prog: argparse.HelpFormatter(prog, width=400))
    add_arguments(parser, SERVE)
    text = parser.format_help()
    assert "  --port N              HTTP port, 0 = any free port (default 8080); $KVGATEWAY_PORT\n" in text
    many_cores = text.split("many cores (NATS JetStream; each also $KVGATEWAY_..., or [cluster] in the file):\n")[1]
    assert many_cores.startswith("  --workers N ")
    assert (
        "--nats URL            with --workers: use this NATS server instead of starting a private one\n" in many_cores
    )


def test_max_learned_blocks_help_gives_the_learners_figures() -> None:
    """The help text is made from the constants the learner uses (issue 33, item 6: it said 2)."""
    from kvgateway.state import learner

    parser = argparse.ArgumentParser()
    add_arguments(parser, SERVE)
    text = " ".join(parser.format_help().split())
    assert f"{learner.LEARNED_PER_RESIDENT:g} per resident block" in text
    assert f"at least {learner.LEARNED_FLOOR}" in text

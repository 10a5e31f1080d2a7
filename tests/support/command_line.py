"""A command's arguments parsed and loaded as the command does: the parser made from its option
set (kvgateway.config.arguments), then the loader, with the environment given (never the test
process's own)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path

from kvgateway.cli import SERVE
from kvgateway.config.arguments import add_arguments
from kvgateway.config.loading import Loaded, load
from kvgateway.config.options import OptionSet
from kvgateway.config.settings import Settings


def parse(takes: OptionSet, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, takes)
    return parser.parse_args(list(argv))


def load_command(takes: OptionSet, *argv: str, environ: Mapping[str, str] | None = None) -> Loaded:
    return load(takes, parse(takes, *argv), environ={} if environ is None else environ)


def serve_settings(*argv: str, environ: Mapping[str, str] | None = None) -> Settings:
    """``kvgateway serve``'s settings for ``argv``."""
    return load_command(SERVE, *argv, environ=environ).settings


def serve_file_settings(text: str, directory: Path) -> Settings:
    """``kvgateway serve --config FILE``'s settings for the TOML ``text`` (a file deploy/ ships),
    its ``token_file`` (a secret mounted where it runs) pointed at a token written in ``directory``."""
    token = directory / "token"
    token.write_text("test-token-0123456789\n", encoding="utf-8")
    text = re.sub(r'(?m)^(\s*)token_file = ".*"$', lambda m: f'{m[1]}token_file = "{token}"', text)
    path = directory / "kvgateway.toml"
    path.write_text(text, encoding="utf-8")
    return serve_settings("--config", str(path))

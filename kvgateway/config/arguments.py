"""The command line made from the option table: a command's flags, grouped as --help shows them,
each with no argparse default (None is "not given": the loader looks at the environment and the
file next)."""

from __future__ import annotations

import argparse

from kvgateway.config.options import CONFIG_ENV, GROUPS, SOURCES_ENV, Option, OptionSet

SOURCE_HELP = (
    "name=NAME,endpoint=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T][,dp_size=N][,bind=true]"
    "[,capacity_blocks=GPU:N/CPU:N], or name=NAME,host=HOST,dp_size=N,kv_events_config=JSON with the "
    f"JSON given to vllm serve --kv-events-config (repeatable; or ${SOURCES_ENV}, specs separated by ';'; "
    "replaces the file's sources)"
)


def add_arguments(parser: argparse.ArgumentParser, takes: OptionSet) -> None:
    """``takes``' flags: ``--config`` and ``--source`` first (the engines), then each option in
    its group, the groups in the order of their first option."""
    if takes.sources:
        engines = parser.add_argument_group("engines")
        engines.add_argument("--config", metavar="FILE", help=f"TOML file ([server], [[sources]]); or ${CONFIG_ENV}")
        engines.add_argument("--source", action="append", metavar="SPEC", help=SOURCE_HELP)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in takes.options():
        name = takes.group_of(option)
        if name not in groups:
            groups[name] = parser.add_argument_group(GROUPS[name].title)
        _add(groups[name], option, takes.help_of(option))


def _add(group: argparse._ArgumentGroup, option: Option, help: str) -> None:
    if option.is_switch:
        group.add_argument(option.flag_name, action="store_true", default=None, help=help)
    elif option.kind is list:
        group.add_argument(option.flag_name, action="append", metavar=option.metavar, help=help)
    else:
        default_metavar = {int: "N", float: "SECONDS"}.get(option.kind, option.key.split("_")[-1].upper())
        metavar = option.metavar or ("|".join(option.choices) if option.choices else default_metavar)
        # Values are checked by coerce, not argparse: one wording for flags, variables and keys.
        group.add_argument(option.flag_name, metavar=metavar, help=help)


def flag_names(parser: argparse.ArgumentParser) -> set[str]:
    """Every --flag of ``parser`` and its subcommands (for the docs test)."""
    names: set[str] = set()
    for action in parser._actions:
        names.update(opt for opt in action.option_strings if opt.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= flag_names(sub)
    return names

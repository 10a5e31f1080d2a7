"""The one option table: every setting once, with what it is as a flag (``--ring-bytes``), an
environment variable (``KVGATEWAY_RING_BYTES``), a key of the TOML file (``ring_bytes`` in
``[server]``, ``nats_stream`` in ``[cluster]``), its help text and its limits. The argument
parser (arguments.py), the loader (loading.py) and the flags a child process is given are all
made from it; each command takes a part of it (:class:`OptionSet`).

A ``[server]`` option lands on :class:`~kvgateway.config.settings.Settings`' field of the same name;
a ``[cluster]`` one on :class:`~kvgateway.config.cluster.NatsOptions` or
:class:`~kvgateway.config.cluster.Workers` (``lands``), at ``sets``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ENV_PREFIX = "KVGATEWAY_"
CONFIG_ENV = "KVGATEWAY_CONFIG"
SOURCES_ENV = "KVGATEWAY_SOURCES"
NO_EXTENSIONS_ENV = "KVGATEWAY_NO_EXTENSIONS"
"""Not a setting: set (to anything but empty or 0), the process runs the pure-Python core
(:mod:`kvgateway.runtime.extensions`)."""

LEARNED_FLOOR = 65_536
"""The learned chains' cap never follows the fleet below this (kvgateway/state/learner.py says why)."""
LEARNED_PER_RESIDENT = 1.25
"""The learned chains' cap follows the fleet at this many entries per resident block (kvgateway/state/learner.py)."""

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

SERVER, NATS, WORKERS = "server", "nats", "workers"
"""What an option configures (``Option.lands``): the process and its engines (``[server]``), the
link to NATS JetStream, or ``serve --workers`` (both ``[cluster]``)."""


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: a key of its table, a flag and a ``KVGATEWAY_*`` variable.

    A ``bool`` option's flag is a switch (``--allow-unauthenticated``), unless it has a
    ``metavar``: then it takes true or false (``--nats-leases false``)."""

    key: str
    kind: type
    group: str  # its part of --help (GROUPS)
    help: str
    limits: tuple[float, float] | None = None
    choices: tuple[str, ...] = ()
    flag: str = ""  # default: --key-with-dashes
    metavar: str | None = None
    lands: str = SERVER
    sets: str = ""  # the field it sets (default: the key)
    clients: bool = False  # a setting of web clients: kvgateway ingest, which serves none, has no flag for it

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def dest(self) -> str:
        return self.flag_name[2:].replace("-", "_")

    @property
    def table(self) -> str:
        """The TOML file's table that holds its key."""
        return "server" if self.lands == SERVER else "cluster"

    @property
    def attribute(self) -> str:
        return self.sets or self.key

    @property
    def is_switch(self) -> bool:
        return self.kind is bool and self.metavar is None


@dataclass(frozen=True, slots=True)
class Group:
    """A part of --help: its title, and whether each flag's help ends with its variable (or the
    title says it for all)."""

    title: str
    names_variable: bool = True


GROUPS = {
    "http": Group("HTTP"),
    "security": Group("security"),
    "limits": Group("limits"),
    "routers": Group("routers (GET /v1/blocks, POST /v1/lookup, snapshot=blocks)"),
    "logging": Group("logging"),
    "nats": Group("NATS JetStream (each also $KVGATEWAY_NATS_..., or [cluster] nats_... in the file)", False),
    "workers": Group("many cores (NATS JetStream; each also $KVGATEWAY_..., or [cluster] in the file)", False),
}

OPTIONS: tuple[Option, ...] = (
    Option("host", str, "http", "HTTP listen address (default 127.0.0.1; any other needs a token)"),
    Option("port", int, "http", "HTTP port, 0 = any free port (default 8080)", (0, 65535)),
    Option(
        "keepalive_seconds",
        float,
        "http",
        "WebSocket ping and SSE keepalive interval in seconds (default 15)",
        (0.1, 3600),
        clients=True,
    ),
    Option(
        "token",
        str,
        "security",
        "bearer token required on /v1/* (prefer --token-file: argv is visible)",
        clients=True,
    ),
    Option(
        "token_file", str, "security", "read the bearer token from FILE", metavar="FILE", sets="token", clients=True
    ),
    Option(
        "allowed_origins",
        list,
        "security",
        "a browser Origin allowed to open a WebSocket (repeatable; variable: comma-separated)",
        flag="--allowed-origin",
        metavar="ORIGIN",
        clients=True,
    ),
    Option(
        "allowed_hosts",
        list,
        "security",
        "a Host name clients may use (repeatable; variable: comma-separated); guards against DNS rebinding",
        flag="--allowed-host",
        metavar="NAME",
        clients=True,
    ),
    Option("allow_unauthenticated", bool, "security", "allow a non-loopback --host without a token", clients=True),
    Option("max_clients", int, "limits", "web clients at once (default 1000)", (1, 1_000_000), clients=True),
    Option("ring_messages", int, "limits", "resume ring size in messages (default 10000)", (1, 10_000_000)),
    Option("ring_bytes", int, "limits", "resume ring size in bytes (default 64 MiB)", (1024, 2**40), metavar="BYTES"),
    Option(
        "client_queue_bytes",
        int,
        "limits",
        "per-client queue before it is cut (default 1 MiB)",
        (1024, 2**34),
        metavar="BYTES",
        clients=True,
    ),
    Option("replay_timeout", float, "limits", "seconds to wait for an engine's replay (default 5)", (0.05, 3600)),
    Option("restart_window", int, "limits", "seq drop that means a publisher restart (default 1024)", (1, 2**62)),
    Option("hold_limit", int, "limits", "live batches held per stream in a replay (default 10000)", (1, 10_000_000)),
    Option("max_concurrent_replays", int, "limits", "replays in flight across all streams (default 4)", (1, 1024)),
    Option(
        "max_learned_blocks",
        int,
        "routers",
        f"ceiling of learned token chains for lookups by token_ids (the cap follows the fleet: "
        f"{LEARNED_PER_RESIDENT:g} per resident block, at least {LEARNED_FLOOR}); 0 = off (default 2000000)",
        (0, 2**32),
    ),
    Option(
        "refetch_window",
        float,
        "limits",
        "seconds within which a block evicted and stored again counts as a refetch (default 60)",
        (1, 86_400),
        metavar="SECONDS",
    ),
    Option(
        "lookup_rate",
        float,
        "routers",
        "POST /v1/lookup per second, all clients (default 1000)",
        (0.01, 1e7),
        metavar="PER_SECOND",
        clients=True,
    ),
    Option(
        "lookup_burst",
        int,
        "routers",
        "lookups allowed at once above the rate (default 200)",
        (1, 10_000_000),
        clients=True,
    ),
    Option("max_snapshots", int, "routers", "block snapshots served at once (default 4)", (1, 1024), clients=True),
    Option(
        "snapshot_queue_bytes",
        int,
        "routers",
        "a client's live queue while its block snapshot is sent (default 8 MiB)",
        (1024, 2**34),
        metavar="BYTES",
        clients=True,
    ),
    Option("log_format", str, "logging", "text or json (default text)", choices=LOG_FORMATS),
    Option("log_level", str, "logging", "debug shows every HTTP request (default info)", choices=LOG_LEVELS),
    # --- [cluster]: serve --workers, and every role's NATS JetStream
    Option(
        "workers",
        int,
        "workers",
        "run a private nats-server, one ingest and N edge processes sharing --port (default: one process)",
        (1, 1024),
        lands=WORKERS,
        sets="count",
    ),
    Option(
        "state_dir",
        str,
        "workers",
        "where --workers keeps the nats-server store (default: ./kvgateway-state)",
        lands=WORKERS,
    ),
    Option(
        "nats",
        list,
        "nats",
        "a NATS server URL (repeatable; $KVGATEWAY_NATS: comma-separated)",
        metavar="URL",
        lands=NATS,
        sets="servers",
    ),
    Option("nats_stream", str, "nats", "the stream (default KVGATEWAY)", metavar="NAME", lands=NATS, sets="stream"),
    Option(
        "nats_subject_prefix",
        str,
        "nats",
        "subjects PREFIX.SOURCE.RANK (default kvgateway)",
        lands=NATS,
        sets="subject_prefix",
    ),
    Option(
        "nats_retention",
        float,
        "nats",
        "the stream's max_age, the recovery window (default 600)",
        lands=NATS,
        sets="retention_seconds",
    ),
    Option(
        "nats_duplicate_window",
        float,
        "nats",
        "how long a batch id is remembered against duplicates (default 120)",
        lands=NATS,
        sets="duplicate_window_seconds",
    ),
    Option(
        "nats_checkpoint",
        float,
        "nats",
        "edge: write an index checkpoint this often, for edges started later (0: never; default 30)",
        lands=NATS,
        sets="checkpoint_seconds",
    ),
    Option(
        "nats_linger",
        float,
        "nats",
        "ingest: how long a batch may wait for others to share its write to NATS: latency against "
        "CPU (0: none; default 0.003)",
        (0, 1),
        lands=NATS,
        sets="linger_seconds",
    ),
    Option(
        "nats_leases",
        bool,
        "nats",
        "ingest: share the sources with the other ingest processes through leases, each stream read "
        "by one (default true; false: read them all, e.g. a hot standby)",
        metavar="BOOL",
        lands=NATS,
        sets="leases",
    ),
    Option(
        "nats_replicas",
        int,
        "nats",
        "stream replicas, 1 to 5 (an odd number keeps a majority; default 1)",
        (1, 5),
        lands=NATS,
        sets="replicas",
    ),
    Option(
        "nats_creds",
        str,
        "nats",
        "a NATS credentials file (JWT + nkey seed)",
        metavar="FILE",
        lands=NATS,
        sets="creds",
    ),
    Option("nats_token_file", str, "nats", "read a NATS token from FILE", lands=NATS, sets="token_file"),
    Option(
        "nats_tls_ca", str, "nats", "CA bundle to verify the NATS servers", metavar="FILE", lands=NATS, sets="tls_ca"
    ),
    Option(
        "nats_tls_cert", str, "nats", "client certificate (mutual TLS)", metavar="FILE", lands=NATS, sets="tls_cert"
    ),
    Option("nats_tls_key", str, "nats", "client certificate's key", metavar="FILE", lands=NATS, sets="tls_key"),
)
OPTION_BY_KEY = {option.key: option for option in OPTIONS}
SERVER_BY_KEY = {option.key: option for option in OPTIONS if option.table == "server"}
CLUSTER_BY_KEY = {option.key: option for option in OPTIONS if option.table == "cluster"}
OPTION_BY_ENV = {option.env: option for option in OPTIONS}

SERVER_KEYS = tuple(SERVER_BY_KEY)
NATS_KEYS = tuple(option.key for option in OPTIONS if option.lands == NATS)
CLIENT_ONLY = frozenset(option.key for option in OPTIONS if option.clients)
"""The settings of web clients (auth, limits, routers' queries): ``kvgateway ingest`` serves no
client, so it has no flags for them (a shared file or environment may still hold them)."""


@dataclass(frozen=True, slots=True)
class OptionSet:
    """The options one command takes: its flags, in --help order, and the ``[cluster]`` settings
    its loader reads from the environment and the file (every ``[server]`` setting is read there
    for every command: one file or environment may serve them all).

    ``sources``: it has ``--config`` and ``--source``; ``needs_sources``, ``needs_nats``: it cannot
    run without; ``clients``: it serves web clients, so a host other machines reach needs a token.
    ``help`` and ``groups`` are the command's own words and place for an option it uses apart."""

    keys: tuple[str, ...]
    sources: bool = True
    needs_sources: bool = False
    needs_nats: bool = False
    clients: bool = True
    help: Mapping[str, str] = field(default_factory=dict)
    groups: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [key for key in (*self.keys, *self.help, *self.groups) if key not in OPTION_BY_KEY]
        if unknown:
            raise ValueError(f"no such options: {unknown}")

    def options(self) -> tuple[Option, ...]:
        return tuple(OPTION_BY_KEY[key] for key in self.keys)

    def takes(self, option: Option) -> bool:
        return option.key in self.keys

    def help_of(self, option: Option) -> str:
        """The flag's help: its words (the command's own where it has them), and its variable
        unless the group's title names the variables."""
        group = GROUPS[self.group_of(option)]
        words = self.help.get(option.key, option.help)
        return words + f"; ${option.env}" if group.names_variable else words

    def group_of(self, option: Option) -> str:
        return self.groups.get(option.key, option.group)

"""kvgateway.config.loading: the file, the environment and the flags, one precedence for every
setting (flag > environment > file > default), errors in one line naming the setting as it was
given."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgateway.cli import SERVE
from kvgateway.cluster.commands import EDGE, INGEST
from kvgateway.config.errors import ConfigError
from kvgateway.config.loading import Loaded
from kvgateway.config.options import NATS, OPTIONS, SERVER, Option, OptionSet
from kvgateway.demo import DEMO
from tests.support.command_line import load_command, serve_settings

SOURCE = ["--source", "name=a,endpoint=tcp://127.0.0.1:1"]
NATS_URL = ["--nats", "nats://127.0.0.1:4222"]


def test_toml_file_env_and_flags_precedence(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    path = tmp_path / "kv.toml"
    path.write_text(
        f"""
[server]
port = 9000
ring_messages = 50
token_file = "{token_file.as_posix()}"
allowed_origins = ["https://dash.example"]

[[sources]]
name = "vllm-a"
endpoint = "tcp://127.0.0.1:7000"
replay = "tcp://127.0.0.1:7100"
dp_size = 2
capacity_blocks = {{ GPU = 100 }}
"""
    )
    settings = serve_settings("--config", str(path))
    assert settings.port == 9000 and settings.ring_messages == 50 and settings.token == "from-file"
    assert settings.allowed_origins == ("https://dash.example",)
    assert [s.key for s in settings.streams()] == [("vllm-a", 0), ("vllm-a", 1)]
    assert dict(settings.streams()[1].capacity_blocks) == {"GPU": 100}
    # Environment beats the file, flags beat both; --source replaces the file's sources.
    env = {"KVGATEWAY_CONFIG": str(path), "KVGATEWAY_TOKEN": "from-env"}
    settings = serve_settings(environ=env)
    assert settings.token == "from-env" and settings.port == 9000
    settings = serve_settings(
        "--port", "9100", "--token", "flag", "--source", "name=b,endpoint=tcp://127.0.0.1:1", environ=env
    )
    assert settings.port == 9100 and settings.token == "flag"
    assert [s.name for s in settings.sources] == ["b"]


def _command_of(option: Option) -> tuple[OptionSet, list[str]]:
    """A command that takes ``option``, and what it needs besides."""
    return (SERVE, SOURCE) if SERVE.takes(option) else (EDGE, NATS_URL)


def _value(loaded: Loaded, option: Option) -> object:
    target = {SERVER: loaded.settings, NATS: loaded.nats}.get(option.lands, loaded.workers)
    return getattr(target, option.attribute)


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind in (int, float, bool)], ids=lambda o: o.key)
def test_flag_beats_environment_beats_file_beats_default(option: Option, tmp_path: Path) -> None:
    """Every setting, [server] and [cluster] alike, by the command that takes it."""
    takes, needed = _command_of(option)
    default = _value(load_command(takes, *needed), option)
    low = int(option.limits[0]) if option.limits else 0
    samples: dict[type, tuple[object, object, object]] = {
        int: (low + 1, low + 2, low + 3),  # in range, and none is the default
        float: (150.5, 250.5, 350.5),  # above the duplicate window's default, below the retention's
        bool: (not default, default, not default),
    }
    if option.kind is float and option.limits:  # within them, and none is the default
        bottom, span = option.limits[0], option.limits[1] - option.limits[0]
        samples[float] = (bottom + span * 0.15, bottom + span * 0.25, bottom + span * 0.35)
    file_value, env_value, flag_value = samples[option.kind]
    path = tmp_path / "kv.toml"
    literal = str(file_value).lower() if option.kind is bool else str(file_value)
    path.write_text(f"[{option.table}]\n{option.key} = {literal}\n")
    assert _value(load_command(takes, "--config", str(path), *needed), option) == file_value != default
    env = {option.env: str(env_value)}
    assert _value(load_command(takes, "--config", str(path), *needed, environ=env), option) == env_value
    flag = [option.flag_name] if option.is_switch else [option.flag_name, str(flag_value).lower()]
    both = load_command(takes, "--config", str(path), *needed, *flag, environ=env)
    assert _value(both, option) == flag_value


def test_string_settings_precedence(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('[server]\nlog_level = "error"\nallowed_hosts = ["file.example"]\ntoken = "file-token"\n')
    env = {"KVGATEWAY_LOG_LEVEL": "warning", "KVGATEWAY_ALLOWED_HOSTS": "env.example, Env2.example"}
    settings = serve_settings("--config", str(path), *SOURCE, environ=env)
    assert settings.log_level == "warning" and settings.allowed_hosts == ("env.example", "env2.example")
    assert settings.token == "file-token"
    settings = serve_settings(
        "--config", str(path), *SOURCE, "--log-level", "debug", "--allowed-host", "flag.example", environ=env
    )
    assert settings.log_level == "debug" and settings.allowed_hosts == ("flag.example",)


def test_a_token_file_beats_a_token_given_in_the_same_place(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  from-the-file \n")
    settings = serve_settings(*SOURCE, "--token-file", str(token_file), "--token", "on-argv")
    assert settings.token == "from-the-file"
    env = {"KVGATEWAY_TOKEN": "env", "KVGATEWAY_TOKEN_FILE": str(token_file)}
    assert serve_settings(*SOURCE, environ=env).token == "from-the-file"


def test_sources_from_the_environment() -> None:
    json = '{"enable_kv_cache_events": true, "publisher": "zmq"}'
    env = {"KVGATEWAY_SOURCES": f"name=a,endpoint=tcp://127.0.0.1:1; name=b,host=h,kv_events_config={json}"}
    settings = serve_settings(environ=env)
    assert [s.name for s in settings.sources] == ["a", "b"]
    flagged = serve_settings("--source", "name=c,endpoint=tcp://127.0.0.1:2", environ=env)
    assert [s.name for s in flagged.sources] == ["c"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("[server]\nport = 'x'\n", "key 'port'"),
        ("[server]\nport = 70000\n", "key 'port'"),
        ("[server]\ncolour = 1\n", "unknown key 'colour'"),
        ("[server]\nlog_level = 'loud'\n", "log_level"),
        ("server = 1\n", "config: [server] must be a table"),
        ("[other]\n", "unknown table 'other'"),
        ("[[sources]]\nname = 'a'\n", "key 'endpoint' is required"),
        ("[[sources]]\nendpoint = 'tcp://h:1'\n", "[[sources]] #1: key 'name'"),
        ("this is = = not toml", "config file"),
    ],
)
def test_bad_toml(tmp_path: Path, body: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        serve_settings("--config", str(path), "--source", "name=z,endpoint=tcp://h:9")
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file_and_token_file() -> None:
    with pytest.raises(ConfigError, match="config file"):
        serve_settings("--config", "/nonexistent/kv.toml")
    with pytest.raises(ConfigError, match=r"^--config: empty$"):
        serve_settings("--config", "")
    with pytest.raises(ConfigError, match="token file"):
        serve_settings("--token-file", "/nonexistent/token", *SOURCE)


def test_no_sources_is_an_error_for_the_commands_that_read_engines() -> None:
    for takes in (SERVE, INGEST):
        with pytest.raises(ConfigError, match=r"^no sources: give --source, \$KVGATEWAY_SOURCES or a config file"):
            load_command(takes, *NATS_URL) if takes is INGEST else load_command(takes)
    assert load_command(EDGE, *NATS_URL).settings.sources == ()  # the ingest processes announce them
    assert load_command(DEMO).settings.sources == ()  # its engines are its own


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--port", "x"], {}, "--port: expected an integer, got 'x'"),
        (["--port", "70000"], {}, "--port: must be from 0 to 65535, got 70000"),
        (["--log-level", "loud"], {}, "--log-level: one of debug, info, warning, error, got 'loud'"),
        ([], {"KVGATEWAY_PORT": "x"}, "KVGATEWAY_PORT: expected an integer, got 'x'"),
        ([], {"KVGATEWAY_RING_BYTES": "1"}, "KVGATEWAY_RING_BYTES: must be from 1024"),
        ([], {"KVGATEWAY_COLOUR": "red"}, "KVGATEWAY_COLOUR: unknown variable (known: "),
        ([], {"KVGATEWAY_PORT": "tcp://10.0.0.1:8080"}, "enableServiceLinks: false"),
        ([], {"KVGATEWAY_SOURCES": " ; "}, "KVGATEWAY_SOURCES: empty"),
        (["--token", ""], {}, "--token: empty"),
        (["--token", "  "], {}, "--token: empty"),
        ([], {"KVGATEWAY_TOKEN": ""}, "KVGATEWAY_TOKEN: empty"),
    ],
)
def test_errors_name_the_flag_or_variable(argv: list[str], env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        serve_settings(*argv, *SOURCE, environ=env)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_variables_that_are_not_settings_are_no_error() -> None:
    """Kubernetes' service links for a Service named kvgateway, the pure-core switch, the file."""
    env = {
        "KVGATEWAY_SERVICE_HOST": "10.0.0.1",
        "KVGATEWAY_PORT_8080_TCP": "tcp://10.0.0.1:8080",
        "KVGATEWAY_NO_EXTENSIONS": "1",
        "OTHER": "x",
    }
    assert serve_settings(*SOURCE, environ=env) == serve_settings(*SOURCE)


def test_toml_errors_name_the_key_and_unknown_keys_list_the_known(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text("[server]\nport = 'x'\n")
    with pytest.raises(ConfigError, match=r"^\[server\] key 'port': expected an integer, got 'x'$"):
        serve_settings("--config", str(path))
    path.write_text("[server]\ncolour = 1\n")
    with pytest.raises(ConfigError) as info:
        serve_settings("--config", str(path))
    assert "unknown key 'colour' (known: host, port," in str(info.value) and "ring_bytes" in str(info.value)
    assert "workers" not in str(info.value)  # a [cluster] key is no [server] key


@pytest.mark.parametrize(
    ("table", "env", "expected"),
    [
        ("[server]\nring_byts = 1\n", {}, "[server]: unknown key 'ring_byts': did you mean 'ring_bytes'?"),
        ("[cluster]\nnats_stram = 'x'\n", {}, "[cluster]: unknown key 'nats_stram': did you mean 'nats_stream'?"),
        (
            "",
            {"KVGATEWAY_RING_BYTS": "1"},
            "KVGATEWAY_RING_BYTS: unknown variable: did you mean 'KVGATEWAY_RING_BYTES'?",
        ),
        (
            "",
            {"KVGATEWAY_MAX_CLIENT": "1"},
            "KVGATEWAY_MAX_CLIENT: unknown variable: did you mean 'KVGATEWAY_MAX_CLIENTS'?",
        ),
    ],
)
def test_an_unknown_key_close_to_a_known_one_is_named_back(
    tmp_path: Path, table: str, env: dict[str, str], expected: str
) -> None:
    """A typo gets the one name it was meant to be, not the list of forty (issue 33, item 10)."""
    path = tmp_path / "kv.toml"
    path.write_text(table)
    with pytest.raises(ConfigError) as info:
        serve_settings("--config", str(path), environ=env)
    assert str(info.value) == expected


# --- the cluster's settings: flags, KVGATEWAY_* variables, the file's [cluster] table --------------


def test_cluster_settings_from_flags_environment_and_file(tmp_path: Path) -> None:
    """--workers, --state-dir, --nats and every --nats-* are also variables and [cluster] keys; a flag
    beats the environment, which beats the file (the README's promise)."""
    path = tmp_path / "kvgateway.toml"
    path.write_text('[cluster]\nworkers = 3\nstate_dir = "/from-file"\nnats = "nats://file:4222"\n')
    serve = load_command(SERVE, "--config", str(path), *SOURCE)
    assert (serve.workers.count, serve.workers.state_dir, serve.nats.servers) == (
        3,
        "/from-file",
        ("nats://file:4222",),
    )
    env = {"KVGATEWAY_WORKERS": "2", "KVGATEWAY_NATS": "nats://a:1, nats://b:2"}
    serve = load_command(SERVE, "--config", str(path), *SOURCE, environ=env)
    assert (serve.workers.count, serve.workers.state_dir) == (2, "/from-file")
    assert serve.nats.servers == ("nats://a:1", "nats://b:2")
    serve = load_command(
        SERVE, "--config", str(path), *SOURCE, "--workers", "4", "--nats", "nats://flag:1", environ=env
    )
    assert (serve.workers.count, serve.nats.servers) == (4, ("nats://flag:1",))

    path.write_text('[cluster]\nnats = ["nats://x:1"]\nnats_stream = "FILE"\nnats_replicas = 3\nnats_retention = 900\n')
    env = {"KVGATEWAY_NATS_STREAM": "ENV", "KVGATEWAY_NATS_TLS_CA": "/ca.pem"}
    options = load_command(EDGE, "--config", str(path), environ=env).nats
    assert options.servers == ("nats://x:1",) and options.stream == "ENV" and options.replicas == 3
    assert options.retention_seconds == 900.0 and options.tls_ca == "/ca.pem" and options.subject_prefix == "kvgateway"
    edge = ["--nats", "nats://y:1,nats://z:1", "--nats-replicas", "5", "--nats-subject-prefix", "p"]
    options = load_command(EDGE, *edge, environ={"KVGATEWAY_NATS_REPLICAS": "3"}).nats
    assert (options.servers, options.replicas, options.subject_prefix) == (("nats://y:1", "nats://z:1"), 5, "p")


def test_a_cluster_setting_applies_only_to_the_commands_that_take_it(tmp_path: Path) -> None:
    """A shared environment and file: serve has no --nats-stream (its children get the default),
    an edge no --workers; every key of the file is checked all the same."""
    path = tmp_path / "kvgateway.toml"
    path.write_text('[cluster]\nworkers = 2\nnats_stream = "FILE"\n')
    env = {"KVGATEWAY_NATS_STREAM": "ENV", "KVGATEWAY_NATS_REPLICAS": "9", "KVGATEWAY_WORKERS": "0"}
    serve = load_command(SERVE, "--config", str(path), *SOURCE, environ={"KVGATEWAY_NATS_STREAM": "ENV"})
    assert serve.nats.stream == "KVGATEWAY" and serve.workers.count == 2
    edge = load_command(EDGE, "--config", str(path), *NATS_URL, environ={"KVGATEWAY_WORKERS": "0"})
    assert edge.nats.stream == "FILE" and edge.workers.count is None
    with pytest.raises(ConfigError, match="KVGATEWAY_NATS_REPLICAS: must be from 1 to 5, got 9"):
        load_command(EDGE, *NATS_URL, environ=env)
    path.write_text("[cluster]\nnats_replicas = 9\n")
    with pytest.raises(ConfigError, match=r"^\[cluster\] key 'nats_replicas': must be from 1 to 5, got 9$"):
        load_command(SERVE, "--config", str(path), *SOURCE)


@pytest.mark.parametrize(
    ("takes", "given", "fragment"),
    [
        (SERVE, ([], {"KVGATEWAY_WORKERS": "0"}, ""), "KVGATEWAY_WORKERS: must be from 1 to 1024, got 0"),
        (SERVE, (["--workers", "two"], {}, ""), "--workers: expected an integer, got 'two'"),
        (SERVE, ([], {}, "workers = true"), "[cluster] key 'workers': expected an integer"),
        (SERVE, ([], {}, "nodes = 2"), "[cluster]: unknown key 'nodes'"),
        (SERVE, ([], {}, "state_dir = ''"), "[cluster] key 'state_dir': empty"),
        (EDGE, (NATS_URL, {"KVGATEWAY_NATS_REPLICAS": "9"}, ""), "KVGATEWAY_NATS_REPLICAS: must be from 1 to 5"),
        (EDGE, (NATS_URL, {}, 'nats_retention = "long"'), "[cluster] key 'nats_retention': expected a number"),
        (EDGE, (["--nats-leases", "maybe"], {}, ""), "--nats-leases: expected true or false, got 'maybe'"),
        (EDGE, ([], {}, ""), "no NATS server: give --nats URL, $KVGATEWAY_NATS or [cluster] nats in the file"),
        (INGEST, ([*SOURCE, "--nats", "http://h:1"], {}, ""), "--nats 'http://h:1': http:// is not NATS"),
        (
            INGEST,
            ([*SOURCE, *NATS_URL, "--nats-linger", "-0.001"], {}, ""),
            "--nats-linger: must be from 0 to 1, got -0.001",
        ),
        (
            INGEST,
            ([*SOURCE, *NATS_URL], {"KVGATEWAY_NATS_LINGER": "nan"}, ""),
            "KVGATEWAY_NATS_LINGER: must be from 0 to 1, got nan",
        ),
        (
            INGEST,
            ([*SOURCE, *NATS_URL], {}, "nats_linger = 5"),
            "[cluster] key 'nats_linger': must be from 0 to 1, got 5.0",
        ),
        (INGEST, ([*SOURCE, *NATS_URL, "--nats-linger", "3ms"], {}, ""), "--nats-linger: expected a number, got '3ms'"),
    ],
)
def test_bad_cluster_settings_name_where_they_came_from(
    tmp_path: Path, takes: OptionSet, given: tuple[list[str], dict[str, str], str], fragment: str
) -> None:
    argv, env, table = given
    path = tmp_path / "kvgateway.toml"
    path.write_text(f"[cluster]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        load_command(takes, *argv, *(SOURCE if takes is SERVE else []), "--config", str(path), environ=env)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_the_ingest_serves_no_client_so_needs_no_token_on_any_host() -> None:
    with pytest.raises(ConfigError, match="reachable from other machines and no token is set"):
        load_command(EDGE, *NATS_URL, "--host", "0.0.0.0")
    assert load_command(INGEST, *SOURCE, *NATS_URL, "--host", "0.0.0.0").settings.host == "0.0.0.0"


def test_the_demo_has_no_config_flag_but_reads_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text("[server]\nport = 9001\n")
    assert load_command(DEMO, environ={"KVGATEWAY_CONFIG": str(path)}).settings.port == 9001

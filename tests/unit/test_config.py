"""Configuration: CLI flags, TOML, environment, validation with one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvgateway import config
from kvgateway.config import ConfigError, Settings, parse_source_flag
from kvgateway.engine.endpoints import binds, endpoint_problem, is_ipv6, offset_endpoint, rank_endpoints


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_serve_arguments(parser)
    ns = parser.parse_args(list(argv))
    ns.command = "serve"
    return ns


def test_source_flag_full() -> None:
    src = parse_source_flag(
        "name=a,endpoint=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5657,topic=kv,dp_size=2,capacity_blocks=GPU:10/cpu:20"
    )
    assert src.name == "a" and src.dp_size == 2 and src.topic == "kv" and not src.bind
    assert dict(src.capacity_blocks) == {"GPU": 10, "CPU": 20}
    streams = config.expand_source(src)
    assert [(s.dp_rank, s.endpoint, s.replay) for s in streams] == [
        (0, "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5657"),
        (1, "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5658"),
    ]


def test_offset_endpoint_rules() -> None:
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert offset_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    assert offset_endpoint("ipc:///tmp/x", 0) == "ipc:///tmp/x"


def test_wildcard_endpoint_is_bound() -> None:
    assert parse_source_flag("name=a,endpoint=tcp://*:5557").bind
    assert parse_source_flag("name=a,endpoint=tcp://0.0.0.0:5557,bind=true").bind


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("name=a", "key 'endpoint' is required"),
        ("name=a,endpoint=http://x:1", "must start with tcp://"),
        ("name=a,endpoint=tcp://x", "is not tcp://HOST:PORT"),
        ("name=a,endpoint=tcp://x:99999", "is not tcp://HOST:PORT"),
        ("name=a,endpoint=tcp://x:1,dp_size=0", "key 'dp_size'"),
        ("name=a,endpoint=tcp://x:1,dp_size=two", "key 'dp_size'"),
        ("name=a,endpoint=tcp://x:1,bind=maybe", "key 'bind'"),
        ("name=a,endpoint=tcp://x:1,colour=red", "unknown key 'colour'"),
        ("name=a b,endpoint=tcp://x:1", "key 'name'"),
        ("endpoint=tcp://x:1", "key 'name'"),
        ("name=a,endpoint", "expected key=value"),
        ("name=a,endpoint=tcp://x:65535,dp_size=2", "runs past 65535"),
        ("name=a,endpoint=tcp://x:1,replay=tcp://*:2", "key 'replay'"),
        ("name=a,endpoint=tcp://x:1,capacity_blocks=GPU:0", "capacity_blocks"),
        ("name=a,endpoint=tcp://x:1,capacity_blocks=GPU=5", "expected MEDIUM:BLOCKS, separated by '/'"),
        ("name=a,endpoint=tcp://x:1,capacity_blocks=GPU:5/CPU", "(GPU:8192/CPU:65536), got 'CPU'"),
    ],
)
def test_bad_source_flags_name_source_and_key(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_source_flag(spec)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_overlapping_ranges_rejected_naming_both() -> None:
    # vLLM's own trap: with 5557/5558 and two ranks, rank 1's PUB port is rank 0's replay port.
    args = _args("--source", "name=a,endpoint=tcp://h:5557,replay=tcp://h:5558,dp_size=2")
    with pytest.raises(ConfigError) as info:
        config.settings_from_args(args, environ={})
    message = str(info.value)
    assert "source 'a' rank 1 endpoint tcp://h:5558" in message
    assert "source 'a' rank 0 replay tcp://h:5558" in message


def test_two_sources_on_one_port_rejected() -> None:
    args = _args("--source", "name=a,endpoint=tcp://h:1", "--source", "name=b,endpoint=tcp://h:1")
    with pytest.raises(ConfigError, match="source 'b' rank 0 endpoint tcp://h:1 collides with source 'a'"):
        config.settings_from_args(args, environ={})


def test_duplicate_names_rejected() -> None:
    args = _args("--source", "name=a,endpoint=tcp://h:1", "--source", "name=a,endpoint=tcp://h:2")
    with pytest.raises(ConfigError, match="given twice"):
        config.settings_from_args(args, environ={})


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
    settings = config.settings_from_args(_args("--config", str(path)), environ={})
    assert settings.port == 9000 and settings.ring_messages == 50 and settings.token == "from-file"
    assert settings.allowed_origins == ("https://dash.example",)
    assert [s.key for s in settings.streams()] == [("vllm-a", 0), ("vllm-a", 1)]
    assert dict(settings.streams()[1].capacity_blocks) == {"GPU": 100}
    # Environment beats the file, flags beat both; --source replaces the file's sources.
    env = {"KVGATEWAY_CONFIG": str(path), "KVGATEWAY_TOKEN": "from-env"}
    settings = config.settings_from_args(_args(), environ=env)
    assert settings.token == "from-env" and settings.port == 9000
    settings = config.settings_from_args(
        _args("--port", "9100", "--token", "flag", "--source", "name=b,endpoint=tcp://127.0.0.1:1"), environ=env
    )
    assert settings.port == 9100 and settings.token == "flag"
    assert [s.name for s in settings.sources] == ["b"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("[server]\nport = 'x'\n", "key 'port'"),
        ("[server]\nport = 70000\n", "key 'port'"),
        ("[server]\ncolour = 1\n", "unknown key 'colour'"),
        ("[server]\nlog_level = 'loud'\n", "log_level"),
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
        config.settings_from_args(_args("--config", str(path), "--source", "name=z,endpoint=tcp://h:9"), environ={})
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file_and_token_file() -> None:
    with pytest.raises(ConfigError, match="config file"):
        config.settings_from_args(_args("--config", "/nonexistent/kv.toml"), environ={})
    with pytest.raises(ConfigError, match="token file"):
        config.settings_from_args(
            _args("--token-file", "/nonexistent/token", "--source", "name=a,endpoint=tcp://h:1"), environ={}
        )


def test_no_sources_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no sources"):
        config.settings_from_args(_args(), environ={})


def test_public_bind_without_token_needs_explicit_flag() -> None:
    src = ["--source", "name=a,endpoint=tcp://h:1"]
    with pytest.raises(ConfigError, match="--allow-unauthenticated"):
        config.settings_from_args(_args("--host", "0.0.0.0", *src), environ={})
    assert config.settings_from_args(_args("--host", "0.0.0.0", "--allow-unauthenticated", *src), environ={})
    assert config.settings_from_args(_args("--host", "0.0.0.0", "--token", "t", *src), environ={})
    assert config.settings_from_args(_args("--host", "::1", *src), environ={})


def test_summary_never_contains_the_token() -> None:
    settings = config.validate(
        Settings(token="s3cret-value", sources=(parse_source_flag("name=a,endpoint=tcp://h:1"),))
    )
    text = config.summary(settings)
    assert "s3cret-value" not in text and "auth token" in text and "a[0]=tcp://h:1" in text


# --- endpoints: only a real wildcard binds ----------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "bind"),
    [
        ("tcp://*:5557", True),
        ("tcp://0.0.0.0:5557", True),
        ("tcp://[::]:5557", True),
        ("tcp://[::1]:5557", False),
        ("tcp://[fd00::5]:5557", False),
        ("tcp://[2001:db8::1]:5557", False),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://vllm-host:5557", False),
    ],
)
def test_only_a_wildcard_host_means_bind(endpoint: str, bind: bool) -> None:
    assert parse_source_flag(f"name=a,endpoint={endpoint}").bind is bind
    assert binds(endpoint) is bind
    assert parse_source_flag(f"name=a,endpoint={endpoint},bind=true").bind


def test_an_ipv6_engine_may_have_a_replay_socket() -> None:
    # '::' inside an address is no wildcard: this used to be "the engine binds its replay socket".
    src = parse_source_flag("name=a,endpoint=tcp://[fd00::5]:5557,replay=tcp://[fd00::5]:5657,dp_size=2")
    assert [(s.endpoint, s.replay, s.bind) for s in config.expand_source(src)] == [
        ("tcp://[fd00::5]:5557", "tcp://[fd00::5]:5657", False),
        ("tcp://[fd00::5]:5558", "tcp://[fd00::5]:5658", False),
    ]
    assert is_ipv6("tcp://[fd00::5]:5557") and not is_ipv6("tcp://127.0.0.1:5557")


# --- collisions are found between resolved addresses ------------------------------------------


def test_localhost_and_127_0_0_1_are_one_address() -> None:
    args = _args("--source", "name=a,endpoint=tcp://localhost:7557", "--source", "name=b,endpoint=tcp://127.0.0.1:7557")
    with pytest.raises(ConfigError) as info:
        config.settings_from_args(args, environ={})
    message = str(info.value)
    assert "source 'b' rank 0 endpoint tcp://127.0.0.1:7557 collides with source 'a'" in message
    assert "\n" not in message


def test_an_unresolvable_name_is_compared_by_name_and_reported() -> None:
    sources = (parse_source_flag("name=a,endpoint=tcp://no-such-engine.invalid:7557"),)
    assert config.check_overlaps(sources) == ["no-such-engine.invalid"]
    same = (*sources, parse_source_flag("name=b,endpoint=tcp://NO-SUCH-ENGINE.invalid:7557"))
    with pytest.raises(ConfigError, match="collides"):
        config.check_overlaps(same)


# --- a source given as vLLM's --kv-events-config -----------------------------------------------

README_JSON = (
    '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
    '"replay_endpoint": "tcp://*:5657", "topic": "kv-events"}'
)


def test_kv_events_config_derives_endpoints_topic_and_ranks() -> None:
    src = parse_source_flag(f"name=vllm-a,host=vllm-host,dp_size=2,kv_events_config={README_JSON}")
    assert [(s.dp_rank, s.endpoint, s.replay, s.topic, s.bind) for s in config.expand_source(src)] == [
        (0, "tcp://vllm-host:5557", "tcp://vllm-host:5657", "kv-events", False),
        (1, "tcp://vllm-host:5558", "tcp://vllm-host:5658", "kv-events", False),
    ]
    # the same as the explicit form
    explicit = parse_source_flag(
        "name=vllm-a,endpoint=tcp://vllm-host:5557,replay=tcp://vllm-host:5657,topic=kv-events,dp_size=2"
    )
    assert src == explicit


def test_kv_events_config_defaults_ipv6_host_and_connect_out() -> None:
    # vLLM's defaults: endpoint tcp://*:5557, no replay, topic "".
    src = parse_source_flag('name=e,host=fd00::5,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq"}')
    assert (src.endpoint, src.replay, src.topic, src.bind) == ("tcp://[fd00::5]:5557", None, "", False)
    # An engine that connects out (no wildcard): the gateway binds the address it connects to.
    out = parse_source_flag(
        'name=e,host=vllm-host,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://gateway:6000", "replay_endpoint": "tcp://*:6100"}',
    )
    assert out.bind and out.endpoint == "tcp://gateway:6000" and out.replay == "tcp://vllm-host:6100"


def test_kv_events_config_in_toml_as_a_table(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text(
        '[[sources]]\nname = "a"\nhost = "10.0.0.7"\ndp_size = 3\n'
        'kv_events_config = { enable_kv_cache_events = true, publisher = "zmq", endpoint = "tcp://*:7000" }\n'
    )
    settings = config.settings_from_args(_args("--config", str(path)), environ={})
    assert [s.endpoint for s in settings.streams()] == [
        "tcp://10.0.0.7:7000",
        "tcp://10.0.0.7:7001",
        "tcp://10.0.0.7:7002",
    ]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ('name=a,host=h,kv_events_config={"publisher": "zmq"}', '"enable_kv_cache_events": true'),
        ('name=a,host=h,kv_events_config={"enable_kv_cache_events": true}', '"publisher": "zmq"'),
        (
            'name=a,host=h,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq", "port": 1}',
            "unknown key 'port'",
        ),
        ("name=a,host=h,kv_events_config={not json", "not JSON"),
        ('name=a,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq"}', "key 'host' is required"),
        (
            'name=a,host=h,endpoint=tcp://h:1,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq"}',
            "key 'endpoint': derived from kv_events_config",
        ),
        ("name=a,host=h,endpoint=tcp://h:1", "key 'host' goes with kv_events_config"),
        (
            'name=a,dp_size=2,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "ipc:///x"}',
            "cannot run DP ranks",
        ),
    ],
)
def test_bad_kv_events_config(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_source_flag(spec)
    assert fragment in str(info.value) and "\n" not in str(info.value)


# --- one precedence rule, every setting three ways ---------------------------------------------


def test_every_toml_key_is_a_flag_and_a_variable() -> None:
    parser = argparse.ArgumentParser()
    config.add_serve_arguments(parser)
    flags = config.flag_names(parser)
    for option in config.OPTIONS:
        assert option.flag_name in flags, option.key
        assert option.env == "KVGATEWAY_" + option.key.upper()
    assert {"--config", "--source"} <= flags


@pytest.mark.parametrize("option", [o for o in config.OPTIONS if o.kind in (int, float, bool)], ids=lambda o: o.key)
def test_flag_beats_environment_beats_file_beats_default(option: config.Option, tmp_path: Path) -> None:
    low = int(option.limits[0]) if option.limits else 0
    samples: dict[type, tuple[object, object, object]] = {
        int: (low + 1, low + 2, low + 3),  # in range, and none is the default
        float: (2.5, 3.5, 4.5),
        bool: (True, False, True),
    }
    file_value, env_value, flag_value = samples[option.kind]
    path = tmp_path / "kv.toml"
    literal = str(file_value).lower() if option.kind is bool else str(file_value)
    path.write_text(f"[server]\n{option.key} = {literal}\n")
    default = getattr(Settings(), option.key)
    src = ["--source", "name=a,endpoint=tcp://127.0.0.1:1"]
    assert getattr(config.settings_from_args(_args(*src), environ={}), option.key) == default
    from_file = config.settings_from_args(_args("--config", str(path), *src), environ={})
    assert getattr(from_file, option.key) == file_value
    env = {option.env: str(env_value)}
    assert getattr(config.settings_from_args(_args("--config", str(path), *src), environ=env), option.key) == env_value
    flag = [option.flag_name] if option.kind is bool else [option.flag_name, str(flag_value)]
    both = config.settings_from_args(_args("--config", str(path), *src, *flag), environ=env)
    assert getattr(both, option.key) == flag_value


def test_string_settings_precedence(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('[server]\nlog_level = "error"\nallowed_hosts = ["file.example"]\ntoken = "file-token"\n')
    src = ["--source", "name=a,endpoint=tcp://127.0.0.1:1"]
    env = {"KVGATEWAY_LOG_LEVEL": "warning", "KVGATEWAY_ALLOWED_HOSTS": "env.example, Env2.example"}
    settings = config.settings_from_args(_args("--config", str(path), *src), environ=env)
    assert settings.log_level == "warning" and settings.allowed_hosts == ("env.example", "env2.example")
    assert settings.token == "file-token"
    settings = config.settings_from_args(
        _args("--config", str(path), *src, "--log-level", "debug", "--allowed-host", "flag.example"), environ=env
    )
    assert settings.log_level == "debug" and settings.allowed_hosts == ("flag.example",)


def test_sources_from_the_environment() -> None:
    env = {"KVGATEWAY_SOURCES": f"name=a,endpoint=tcp://127.0.0.1:1; name=b,host=h,kv_events_config={README_JSON}"}
    settings = config.settings_from_args(_args(), environ=env)
    assert [s.name for s in settings.sources] == ["a", "b"]
    flagged = config.settings_from_args(_args("--source", "name=c,endpoint=tcp://127.0.0.1:2"), environ=env)
    assert [s.name for s in flagged.sources] == ["c"]


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
        (["--token", ""], {}, "--token: empty"),
        (["--token", "  "], {}, "--token: empty"),
        ([], {"KVGATEWAY_TOKEN": ""}, "KVGATEWAY_TOKEN: empty"),
    ],
)
def test_errors_name_the_flag_or_variable(argv: list[str], env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.settings_from_args(_args(*argv, "--source", "name=a,endpoint=tcp://127.0.0.1:1"), environ=env)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_toml_errors_name_the_key_and_unknown_keys_list_the_known(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text("[server]\nport = 'x'\n")
    with pytest.raises(ConfigError, match=r"^\[server\] key 'port': expected an integer, got 'x'$"):
        config.settings_from_args(_args("--config", str(path)), environ={})
    path.write_text("[server]\ncolour = 1\n")
    with pytest.raises(ConfigError) as info:
        config.settings_from_args(_args("--config", str(path)), environ={})
    assert "unknown key 'colour' (known: host, port," in str(info.value) and "ring_bytes" in str(info.value)


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
        config.settings_from_args(_args("--config", str(path)), environ=env)
    assert str(info.value) == expected


def test_a_source_key_close_to_a_known_one_is_named_back() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'endpiont': did you mean 'endpoint'\?$"):
        parse_source_flag("name=a,endpiont=tcp://127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"unknown key 'replay_endpont': did you mean 'replay_endpoint'\?$"):
        parse_source_flag('name=a,host=h,kv_events_config={"enable_kv_cache_events":true,"replay_endpont":"x"}')


def test_a_source_without_a_name_says_it_is_missing() -> None:
    """Not "got None" (issue 33, item 9)."""
    with pytest.raises(ConfigError) as info:
        parse_source_flag("endpoint=tcp://127.0.0.1:1")
    assert "key 'name' is missing" in str(info.value) and "None" not in str(info.value)


def test_max_learned_blocks_help_gives_the_learners_figures() -> None:
    """The help text is made from the constants the learner uses (issue 33, item 6: it said 2)."""
    from kvgateway.state import learner

    parser = argparse.ArgumentParser()
    config.add_serve_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert f"{learner.LEARNED_PER_RESIDENT:g} per resident block" in text
    assert f"at least {learner.LEARNED_FLOOR}" in text


@pytest.mark.parametrize(
    ("value", "wildcard_port", "problem"),
    [
        ("tcp://127.0.0.1:5557", False, None),
        ("tcp://[fd00::5]:5557", False, None),
        ("tcp://*:5557", False, None),
        ("tcp://*:*", True, None),
        ("tcp://*:0", True, None),
        ("tcp://*:*", False, "is not tcp://HOST:PORT"),
        ("tcp://*:0", False, "port 0 is not in 1-65535"),
        ("tcp://x:65536", True, "port 65536 is not in 1-65535"),
        ("tcp://x", False, "is not tcp://HOST:PORT"),
        ("tcp://::1:5557", False, "is not tcp://HOST:PORT"),
        ("ipc:///tmp/kv", False, None),
        ("inproc://kv", False, None),
        ("ipc://", False, "must start with tcp://, ipc:// or inproc://"),
        ("http://x:1", True, "must start with tcp://, ipc:// or inproc://"),
    ],
)
def test_one_endpoint_rule(value: str, wildcard_port: bool, problem: str | None) -> None:
    assert endpoint_problem(value, wildcard_port=wildcard_port) == problem


def test_rank_endpoints_expand_each_rank_once() -> None:
    assert rank_endpoints("tcp://h:5557", "tcp://h:5657", 2) == [
        (0, "tcp://h:5557", "tcp://h:5657"),
        (1, "tcp://h:5558", "tcp://h:5658"),
    ]
    assert rank_endpoints("ipc:///tmp/kv", None, 2) == [(0, "ipc:///tmp/kv", None), (1, "ipc:///tmp/kv_dp1", None)]


def test_summary_of_many_streams_is_one_short_line() -> None:
    """64 streams: counted, not listed (the issue saw an 8,042-character line); a few: each listed."""
    sources = tuple(parse_source_flag(f"name=pool-{n:02d},endpoint=tcp://h:{1000 + 8 * n},dp_size=8") for n in range(8))
    text = config.summary(config.validate(Settings(sources=sources)))
    assert len(text) < 300, text
    assert "streams: 64 from 8 sources (pool-00, pool-01, pool-02 ... pool-07; --log-level debug lists them)" in text
    assert len(config.stream_lines(Settings(sources=sources))) == 64
    few = config.summary(Settings(sources=sources[:1]))
    assert "pool-00[7]=tcp://h:1007" in few


# --- the cluster's settings: flags, KVGATEWAY_* variables, the file's [cluster] table --------------


def _cluster_args(*argv: str) -> argparse.Namespace:
    from kvgateway import cli

    return cli.build_parser().parse_args(list(argv))


def test_cluster_settings_from_flags_environment_and_file(tmp_path: Path) -> None:
    """--workers, --state-dir, --nats and every --nats-* are also variables and [cluster] keys; a flag
    beats the environment, which beats the file (the README's promise, which these broke)."""
    path = tmp_path / "kvgateway.toml"
    path.write_text('[cluster]\nworkers = 3\nstate_dir = "/from-file"\nnats = "nats://file:4222"\n')
    serve = _cluster_args("serve", "--config", str(path))
    config.resolve_cluster(serve, environ={})
    assert (serve.workers, serve.state_dir, serve.nats) == (3, "/from-file", ["nats://file:4222"])
    env = {"KVGATEWAY_WORKERS": "2", "KVGATEWAY_NATS": "nats://a:1, nats://b:2"}
    serve = _cluster_args("serve", "--config", str(path))
    config.resolve_cluster(serve, environ=env)
    assert (serve.workers, serve.state_dir, serve.nats) == (2, "/from-file", ["nats://a:1", "nats://b:2"])
    serve = _cluster_args("serve", "--config", str(path), "--workers", "4", "--nats", "nats://flag:1")
    config.resolve_cluster(serve, environ=env)
    assert (serve.workers, serve.nats) == (4, ["nats://flag:1"])
    # The environment check knows them (KVGATEWAY_WORKERS was "unknown variable").
    assert config.settings_from_env(env, Settings()) == Settings()

    from kvgateway.cluster.options import options_from_args

    path.write_text('[cluster]\nnats = ["nats://x:1"]\nnats_stream = "FILE"\nnats_replicas = 3\nnats_retention = 900\n')
    edge = _cluster_args("edge", "--config", str(path))
    config.resolve_cluster(edge, environ={"KVGATEWAY_NATS_STREAM": "ENV", "KVGATEWAY_NATS_TLS_CA": "/ca.pem"})
    options = options_from_args(edge, "edge")
    assert options.servers == ("nats://x:1",) and options.stream == "ENV" and options.replicas == 3
    assert options.retention_seconds == 900.0 and options.tls_ca == "/ca.pem" and options.subject_prefix == "kvgateway"
    edge = _cluster_args("edge", "--nats", "nats://y:1", "--nats-replicas", "5", "--nats-subject-prefix", "p")
    config.resolve_cluster(edge, environ={"KVGATEWAY_NATS_REPLICAS": "3"})
    options = options_from_args(edge, "edge")
    assert (options.servers, options.replicas, options.subject_prefix) == (("nats://y:1",), 5, "p")


@pytest.mark.parametrize(
    ("argv", "env", "table", "fragment"),
    [
        (["serve"], {"KVGATEWAY_WORKERS": "0"}, "", "KVGATEWAY_WORKERS: must be from 1 to 1024, got 0"),
        (["serve", "--workers", "two"], {}, "", "--workers: expected an integer, got 'two'"),
        (["serve"], {}, "workers = true", "[cluster] key 'workers': expected an integer"),
        (["serve"], {}, "nodes = 2", "[cluster]: unknown key 'nodes'"),
        (["edge"], {"KVGATEWAY_NATS_REPLICAS": "9"}, "", "KVGATEWAY_NATS_REPLICAS: must be from 1 to 5"),
        (["edge"], {}, 'nats_retention = "long"', "[cluster] key 'nats_retention': expected a number"),
    ],
)
def test_bad_cluster_settings_name_where_they_came_from(
    tmp_path: Path, argv: list[str], env: dict[str, str], table: str, fragment: str
) -> None:
    path = tmp_path / "kvgateway.toml"
    path.write_text(f"[cluster]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        config.resolve_cluster(_cluster_args(*argv, "--config", str(path)), environ=env)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_every_cluster_setting_is_a_flag_of_its_commands() -> None:
    """The [cluster] table and the flags name the same settings: serve has the --workers ones,
    ingest and edge every --nats-*."""
    from kvgateway import cli

    def flags(*argv: str) -> set[str]:
        return set(vars(cli.build_parser().parse_args(list(argv))))

    serve, edge, ingest = flags("serve"), flags("edge"), flags("ingest")
    for option in config.CLUSTER_OPTIONS:
        wanted = [serve] if option.key in ("workers", "state_dir") else [edge, ingest]
        assert all(option.dest in names for names in wanted), option.key
    assert "nats" in serve

"""Configuration: layering (defaults < file < environment < flags), checks that name the key, secrets."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os

import pytest

from broker_filter import config as cfg
from broker_filter.config import ConfigError, add_serve_arguments, load, load_for_cli
from broker_filter.security import hash_password

PW_HASH = hash_password("s3cret", algorithm="pbkdf2-sha256")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="broker-filter serve")
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def write(tmp_path, text: str) -> str:
    path = tmp_path / "broker-filter.toml"
    path.write_text(text)
    return str(path)


def error_of(args=None, environ=None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(args, environ or {})
    return info.value


def test_defaults_are_loopback_embedded_and_anonymous():
    config = load(None, {})
    assert (config.listener.host, config.listener.port) == ("127.0.0.1", 5672)
    assert config.upstream.embedded
    assert config.listener.anonymous_allowed
    assert config.listener.effective_mechanisms == ("ANONYMOUS", "PLAIN")
    assert not config.metrics.enabled  # off unless told (and `:PORT` binds loopback)
    assert config.logging.format == "text"


def test_config_is_frozen():
    config = load(None, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.listener.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.virtual_addresses["x"] = None  # type: ignore[index]


def test_file_then_environment_then_flags(tmp_path):
    path = write(
        tmp_path,
        """
        [listener]
        port = 6000
        [limits]
        selector_length = 100
        connections = 7
        [logging]
        level = "debug"
        """,
    )
    env = {"BROKER_FILTER_LIMITS_SELECTOR_LENGTH": "200", "BROKER_FILTER_LISTENER_PORT": "6001"}
    config = load(parse("--config", path, "--listen", "127.0.0.1:6002"), env)
    assert config.listener.port == 6002  # flag beats environment beats file
    assert config.limits.selector_length == 200  # environment beats file
    assert config.limits.connections == 7  # file beats default
    assert config.logging.level == "DEBUG"  # choices are case-insensitive, stored canonically


def test_config_path_from_environment(tmp_path):
    path = write(tmp_path, "[limits]\nnesting_depth = 5\n")
    assert load(parse(), {"BROKER_FILTER_CONFIG": path}).limits.nesting_depth == 5


def test_upstream_flags_repeat_for_failover_and_empty_means_embedded(tmp_path):
    path = write(tmp_path, '[upstream]\nurls = ["amqp://a:5672"]\n')
    config = load(parse("--config", path, "--upstream", "amqp://b:5672", "--upstream", "amqps://c"), {})
    assert config.upstream.urls == ("amqp://b:5672", "amqps://c")
    assert load(parse("--config", path, "--upstream", ""), {}).upstream.embedded


def test_environment_lists_and_booleans():
    env = {
        "BROKER_FILTER_UPSTREAM_URLS": "amqp://a, amqp://b",
        "BROKER_FILTER_JOURNAL_ENABLED": "yes",
        "BROKER_FILTER_JOURNAL_DIRECTORY": "/tmp/j",
        "BROKER_FILTER_UPSTREAM_EVALUATES_SELECTORS": "auto",
        "BROKER_FILTER_LISTENER_ALLOW_ANONYMOUS": "false",
    }
    config = load(parse(f"--set=listener.users={{alice = \"{PW_HASH}\"}}"), env)
    assert config.upstream.urls == ("amqp://a", "amqp://b")
    assert config.journal.enabled is True
    assert config.upstream.evaluates_selectors is None
    assert not config.listener.anonymous_allowed
    assert config.listener.effective_mechanisms == ("PLAIN",)


def test_unrelated_prefixed_environment_variables_are_ignored():
    assert load(None, {"BROKER_FILTER_FUZZ_EXAMPLES": "10"}).limits.selector_length == 4096


def test_the_documented_error_message():
    err = error_of(parse("--set", "limits.selector_length=-1"))
    assert err.key == "limits.selector_length"
    assert str(err) == "limits.selector_length: must be a positive integer, got -1 (from --set)"


@pytest.mark.parametrize(
    "toml, key, reason",
    [
        ("[limits]\nselector_length = -1", "limits.selector_length", "must be a positive integer, got -1"),
        ("[limits]\nselector_length = 'x'", "limits.selector_length", "must be an integer"),
        ("[limits]\nselector_length = true", "limits.selector_length", "must be an integer"),
        ("[limits]\nupstream_window = -3", "limits.upstream_window", "must be an integer >= 0, got -3"),
        ("[listener]\nport = 70000", "listener.port", "0-65535"),
        ("[listener]\nprot = 1", "listener.prot", "unknown setting (did you mean 'port'?)"),
        ("[listner]\nport = 1", "listner", "unknown setting (did you mean 'listener'?)"),
        ("listener = 5", "listener", "must be a table"),
        ("[logging]\nformat = 'xml'", "logging.format", "must be one of text, json"),
        ("[listener]\nsasl_mechanisms = ['GSSAPI']", "listener.sasl_mechanisms", "GSSAPI"),
        ("[listener]\nsasl_mechanisms = []", "listener.sasl_mechanisms", "at least one"),
        ("[listener]\nallow_anonymous = 'maybe'", "listener.allow_anonymous", "true, false or auto"),
        ("[upstream]\nurls = 'amqp://x'", "upstream.urls", "list of strings"),
        ("[upstream]\nurls = ['http://x']", "upstream.urls[0]", "amqp:// or amqps://"),
        ("[upstream]\nurls = ['amqp://x:notaport']", "upstream.urls[0]", "port must be a number"),
        ("[upstream]\nurls = ['amqp://']", "upstream.urls[0]", "no host"),
        ("[upstream]\ncredentials = 'pass-through'", "upstream.credentials", "needs upstream.urls"),
        ("[upstream.reconnect]\nmultiplier = 0.5", "upstream.reconnect.multiplier", "must be >= 1"),
        ("[upstream.reconnect]\ninitial_delay = 5\nmax_delay = 1", "upstream.reconnect.max_delay", ">= "),
        ("[upstream.tls]\nverify = 'sometimes'", "upstream.tls.verify", "peer-name, peer, none"),
        ("[upstream.tls]\nca_file = '/nonexistent/ca.pem'", "upstream.tls.ca_file", "file not found"),
        ("[listener.tls]\ncert_file = '/nonexistent/c.pem'", "listener.tls.key_file", "is required"),
        ("[listener.tls]\nverify_client = true", "listener.tls.ca_file", "is required"),
        ("[listener]\nsasl_mechanisms = ['EXTERNAL']", "listener.sasl_mechanisms", "verify_client"),
        ("[metrics]\nlisten = 'nohost'", "metrics.listen", "HOST:PORT"),
        ("[metrics]\naddress_labels = 0", "metrics.address_labels", "positive integer"),
        ("[journal]\nenabled = true", "journal.directory", "is required"),
        ("[listener.users]\nalice = 'plaintext'", "listener.users.alice", "plain-text passwords are not accepted"),
        ("[listener.users]\nalice = '$md5$x$y$z'", "listener.users.alice", "unknown password hash algorithm"),
        ("[[address_rules]]\nrouting_type = 'anycast'", "address_rules[0].pattern", "non-empty"),
        ("[[address_rules]]\npattern = 'a.#'\nrouting_type = 'broadcast'", "address_rules[0].routing_type",
         "anycast or multicast"),
        ("[[address_rules]]\npattern = 'a'\nupstream = '/queue/{name}'", "address_rules[0].upstream",
         "unknown placeholder {name}"),
        ("[[address_rules]]\npattern = 'a'\nqueue = 'x'", "address_rules[0].queue", "unknown setting"),
        ("[virtual_addresses.red]\nselector = 'a = 1'", "virtual_addresses.red.upstream", "must name"),
        ("[virtual_addresses.red]\nupstream = 'orders'", "virtual_addresses.red", "exactly one of"),
        ("[virtual_addresses.red]\nupstream = 'o'\nselector = 'a=1'\nfilter_set = '{}'",
         "virtual_addresses.red", "exactly one of"),
        ("[virtual_addresses.red]\nupstream = 'o'\nfilter_set = '{oops'", "virtual_addresses.red.filter_set",
         "invalid JSON"),
        ("[virtual_addresses.red]\nupstream = 'red'\nselector = 'a = 1'", "virtual_addresses.red.upstream",
         "must differ"),
        ("[replicas]\nself = 'a:1'", "replicas.self", "needs replicas.peers"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\ndns = 'bf:5672'", "replicas.self", "is required with replicas.dns"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\ndns = 'bf:5672'\npeers = ['a:1']\nself = 'a:1'", "replicas.dns", "set one of them"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\ndns = 'bf'\nself = 'a:1'", "replicas.dns", "HOST:PORT"),
        ("[replicas]\ndns = 'bf:5672'\nself = 'a:5672'", "replicas.peers", "need an upstream broker"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\npeers = ['a:1', 'b:2']", "replicas.self", "is required"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\npeers = ['a:1', 'b:2']\nself = 'c:3'", "replicas.self", "c:3 is not in replicas.peers"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\npeers = ['a:1', 'nohost']\nself = 'a:1'", "replicas.peers[1]", "HOST:PORT"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\npeers = ['a:1', 'a:1']\nself = 'a:1'", "replicas.peers", "names a replica twice"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\npeers = ['a:0']\nself = 'a:0'", "replicas.peers[0]", "port other than 0"),
        ("[replicas]\npeers = ['a:1']\nself = 'a:1'", "replicas.peers", "need an upstream broker"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[listener]\nworkers = 2\n[replicas]\npeers = ['a:1']\nself = 'a:1'", "replicas.peers",
         "listener.workers"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\npeers = ['a:1']\nself = 'a:1'\npassword = 'x'", "replicas.user", "is required"),
        ("[upstream]\nurls = ['amqp://127.0.0.1']\n[replicas]\npeers = ['a:1']\nself = 'a:1'\nheartbeat = 0", "replicas.heartbeat", ">= 0.1"),
    ],
)
def test_bad_values_name_the_key_and_the_reason(tmp_path, toml, key, reason):
    err = error_of(parse("--config", write(tmp_path, toml)))
    assert err.key == key
    assert reason in err.reason


def test_bad_environment_value_names_the_variable():
    err = error_of(None, {"BROKER_FILTER_LIMITS_CONNECTIONS": "many"})
    assert err.key == "limits.connections"
    assert "BROKER_FILTER_LIMITS_CONNECTIONS" in err.reason


def test_bad_listen_flag():
    err = error_of(parse("--listen", "localhost"))
    assert err.key == "--listen" and "HOST:PORT" in err.reason


def test_missing_and_malformed_files(tmp_path):
    err = error_of(parse("--config", str(tmp_path / "absent.toml")))
    assert err.key == "config" and "file not found" in err.reason
    err = error_of(parse("--config", write(tmp_path, "[limits\nx = 1")))
    assert err.key == "config" and "invalid TOML" in err.reason and "line 1" in err.reason


def test_anonymous_is_off_on_non_loopback_listeners():
    config = load(parse("--listen", "0.0.0.0:5999", "--set", "listener.allow_anonymous=true"), {})
    assert config.listener.anonymous_allowed
    err = error_of(parse("--listen", "0.0.0.0:5999"))
    assert err.key == "listener.users" and "no client could log in" in err.reason
    users = f'--set=listener.users={{alice = "{PW_HASH}"}}'
    config = load(parse("--listen", "0.0.0.0:5999", users), {})
    assert not config.listener.anonymous_allowed
    assert config.listener.effective_mechanisms == ("PLAIN",)
    assert set(config.listener.users) == {"alice"}
    ipv6 = load(parse("--listen", "[::1]:5999"), {})
    assert ipv6.listener.host == "::1" and ipv6.listener.anonymous_allowed


def test_pass_through_needs_plain_and_an_upstream():
    config = load(parse("--listen", "0.0.0.0:1", "--upstream", "amqp://rabbit:5672",
                        "--set", "upstream.credentials=pass-through"), {})
    assert config.upstream.credentials == "pass-through"
    assert config.listener.effective_mechanisms == ("PLAIN",)
    err = error_of(parse("--upstream", "amqp://r", "--set", "upstream.credentials=pass-through",
                         "--set", "listener.sasl_mechanisms=ANONYMOUS"))
    assert err.key == "upstream.credentials"


def test_secrets_never_appear_in_repr_errors_or_print_config(tmp_path, capsys):
    env = {"BROKER_FILTER_UPSTREAM_USER": "svc", "BROKER_FILTER_UPSTREAM_PASSWORD": "hunter2"}
    args = parse("--upstream", "amqp://bob:swordfish@rabbit:5672", "--print-config",
                 f"--set=listener.users={{alice = \"{PW_HASH}\"}}")
    config = load(args, env)
    assert config.upstream.password == "hunter2"
    text = repr(config)
    for secret in ("hunter2", "swordfish", PW_HASH):
        assert secret not in text
    assert "amqp://bob:***@rabbit:5672" in text
    with pytest.raises(SystemExit) as info:
        load_for_cli(args, env)
    assert info.value.code == 0
    printed = capsys.readouterr().out
    effective = json.loads(printed)
    assert effective["upstream"]["urls"] == ["amqp://bob:***@rabbit:5672"]
    assert effective["upstream"]["password"] == "***"
    assert effective["listener"]["users"] == {"alice": "***"}
    for secret in ("hunter2", "swordfish", PW_HASH):
        assert secret not in printed
    err = error_of(parse("--upstream", "amqp://bob:swordfish@rabbit:notaport"))
    assert "swordfish" not in str(err) and "bob:***@" in str(err)
    err = error_of(parse("--config", write(tmp_path, "[upstream]\nurls = 'amqp://bob:swordfish@rabbit'\n")))
    assert err.key == "upstream.urls" and "swordfish" not in str(err) and "bob:***@rabbit" in str(err)
    err = error_of(None, {"BROKER_FILTER_UPSTREAM_PASSWORD": "hunter2"})
    assert err.key == "upstream.user" and "hunter2" not in str(err)


def test_load_for_cli_exits_2_naming_key_and_reason():
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as info:
        load_for_cli(parse("--set", "limits.selector_length=-1"), {}, stderr=stderr)
    assert info.value.code == 2
    assert stderr.getvalue() == (
        "broker-filter: config error: limits.selector_length: must be a positive integer, got -1 (from --set)\n"
    )


def test_hostport_parsing():
    assert cfg.split_hostport("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert cfg.split_hostport("[::]:1") == ("::", 1)
    assert cfg.split_hostport(":9464") == ("0.0.0.0", 9464)
    with pytest.raises(ValueError):
        cfg.split_hostport("host:99999")
    config = load(parse("--metrics", "[::1]:9464"), {})
    assert (config.metrics.host, config.metrics.port, config.metrics.listen) == ("::1", 9464, "[::1]:9464")


def test_reconnect_backoff_grows_to_the_cap():
    r = load(None, {"BROKER_FILTER_UPSTREAM_RECONNECT_MAX_DELAY": "3"}).upstream.reconnect
    assert [r.delay(i) for i in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert r.delay(10_000) == 3.0
    assert r.delay(0, rand=1.0) == pytest.approx(0.55)


def test_every_setting_has_a_unique_environment_variable_and_documentation():
    names = [cfg.env_name(key) for key, _ in cfg._leaves()]
    assert len(names) == len(set(names))
    for key, f in cfg._leaves():
        assert f.metadata["doc"], key


def test_shipped_config_file_loads_and_documents_every_key():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "config", "broker-filter.toml")
    if not os.path.exists(path):
        pytest.fail("config/broker-filter.toml is missing")
    text = open(path).read()
    load(parse("--config", path), {})
    for key, _ in cfg._leaves():
        assert key.rsplit(".", 1)[-1] in text, f"{key} is not documented in config/broker-filter.toml"


@pytest.mark.parametrize(
    "toml, key, reason",
    [
        ("[virtual_addresses.v]\nupstream = 'o'\nselector = 'color = '", "virtual_addresses.v.selector",
         "line 1, column"),
        ("[virtual_addresses.v]\nupstream = 'o'\nselector = 'a = 1'\ndialect = 'sql'", "virtual_addresses.v.dialect",
         "unknown selector dialect"),
        ("[virtual_addresses.v]\nupstream = 'o'\nfilter_set = '{\"k\": {\"descriptor\": \"x:unknown\", \"value\": 1}}'",
         "virtual_addresses.v.filter_set", "entry 'k'"),
        ("[limits]\nselector_length = 5\n[virtual_addresses.v]\nupstream = 'o'\nselector = 'color = 1'",
         "virtual_addresses.v.selector", ""),
        ("[limits]\nnesting_depth = 2\n[virtual_addresses.v]\nupstream = 'o'\nselector = 'NOT NOT NOT a = 1'",
         "virtual_addresses.v.selector", ""),
    ],
)
def test_bad_virtual_address_filters_name_the_key(tmp_path, toml, key, reason):
    err = error_of(parse("--config", write(tmp_path, toml)))
    assert err.key == key
    assert reason in err.reason


def test_filter_limits_follow_the_configuration():
    limits = load(parse("--set", "limits.selector_length=10", "--set", "limits.nesting_depth=3"), {}).limits
    core = limits.filter_limits()
    assert (core.max_length, core.max_depth) == (10, 3)

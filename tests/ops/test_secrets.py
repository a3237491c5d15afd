"""Secrets stay secret: no password in any error message or log line (malformed URLs included, from
every place a URL can come from), the upstream password from a file or the environment instead of
argv, and a warning when the configuration file that holds a secret is readable by others.  The
daemon runs as `broker-filter serve`, against real RabbitMQ where it logs in."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker_filter.config import add_serve_arguments, load_for_cli
from launcher import ROOT, Daemon, free_port

PASSWORD = "Zq9Xw7Vt"
# Pieces of the password that must never be seen either (a parser may quote part of it).
PIECES = ("Zq9X", "Xw7V", "w7Vt")


def serve(*args: str, env: dict | None = None, config: str | None = None, tmp_path: Path | None = None,
          mode: int = 0o600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "broker_filter", "serve", "--listen", "127.0.0.1:0", "--metrics", ""]
    if config is not None:
        path = tmp_path / "broker-filter.toml"
        path.write_text(config)
        path.chmod(mode)
        cmd += ["--config", str(path)]
    return subprocess.run([*cmd, *args, "--print-config"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def assert_secret_free(text: str) -> None:
    for piece in PIECES:
        assert piece not in text, text


BAD_URLS = [
    f"amqp://bob:{PASSWORD}@rabbit:badport",
    f"amqp://bob:{PASSWORD}@rabbit:99999",
    f"amqp://bob:{PASSWORD}@rabbit:0",
    f"amqp://bob:{PASSWORD}@[::1",
    f"amqp://bob:{PASSWORD[:4]}/{PASSWORD[4:]}@rabbit",  # an unescaped / in the password
    f"amqp://bob:{PASSWORD[:4]}#{PASSWORD[4:]}@rabbit:5672",
    f"amqp://bob:{PASSWORD[:4]}?{PASSWORD[4:]}@rabbit",
    f"amqp://bob:{PASSWORD[:4]}:{PASSWORD[4:]}@rabbit:x",
    f"amqp://bob:{PASSWORD}@:5672",
    f"http://bob:{PASSWORD}@rabbit",
    f"bob:{PASSWORD}@rabbit:5672",
]


def cli_error(argv: list[str], env: dict | None = None) -> str:
    """What `broker-filter serve ARGV` prints before exiting 2 (load_for_cli in this process)."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as info:
        load_for_cli(parser.parse_args(argv), env or {}, stderr=stderr)
    assert info.value.code == 2, (argv, env, stderr.getvalue())
    return stderr.getvalue()


@pytest.mark.parametrize("url", BAD_URLS)
def test_no_password_in_url_errors_from_anywhere(url, tmp_path):
    path = tmp_path / "broker-filter.toml"
    path.write_text(f"[upstream]\nurls = [{json.dumps(url)}]\n")
    for argv, env in ((["--upstream", url], {}), (["--set", f"upstream.urls={url}"], {}),
                      ([], {"BROKER_FILTER_UPSTREAM_URLS": url}), (["--config", str(path)], {})):
        err = cli_error(argv, env)
        assert err.startswith("broker-filter: config error: upstream.urls"), (argv, env, err)
        assert_secret_free(err)


def test_no_password_in_url_errors_of_the_command(tmp_path):
    for url in BAD_URLS[:2] + BAD_URLS[4:5]:
        out = serve("--upstream", url)  # (--print-config: the configuration, and why serve would refuse it)
        assert out.stderr.startswith(("broker-filter: config error: upstream.urls",
                                      "broker-filter: serve would refuse this configuration: upstream.urls")), out.stderr
        assert "Traceback" not in out.stderr
        assert_secret_free(out.stdout + out.stderr)


def test_no_secret_in_other_errors():
    for args in (["--set", f"upstream.password={PASSWORD}"],  # without a user
                 ["--set", f"replicas.password={PASSWORD}", "--set", "replicas.peers=a:1", "--set", "replicas.self=a:1",
                  "--upstream", "amqp://rabbit"],
                 ["--set", f"listener.users={{alice = \"{PASSWORD}\"}}"],  # a plain-text password, refused
                 ["--set", f"metrics.token={PASSWORD} x"]):
        assert_secret_free(cli_error(args))


def test_every_secret_setting_is_masked_in_the_log():
    """Whatever a log line quotes, the configured secrets read `***`: the upstream's, the replicas' and
    the key passwords, the metrics token, the users' hashes."""
    import logging

    from broker_filter.logs import configure_from, unconfigure

    secrets = {"upstream.password": "s3cret-upstream", "replicas.password": "s3cret-replicas",
               "metrics.token": "s3cret-token", "listener.tls.key_password": "s3cret-key"}
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = ["--upstream", "amqp://rabbit", "--set", "upstream.user=u", "--set", "replicas.user=r"]
    for key, value in secrets.items():
        argv += ["--set", f"{key}={value}"]
    config = load_for_cli(parser.parse_args(argv), {})
    out = io.StringIO()
    configure_from(config, stream=out)
    try:
        logging.getLogger("broker_filter.test").warning("quoted: %s", " ".join(secrets.values()))
    finally:
        unconfigure()
    text = out.getvalue()
    assert "quoted:" in text
    assert not [value for value in secrets.values() if value in text], text


@pytest.mark.rabbitmq
def test_no_password_in_the_log_when_the_upstream_refuses_or_is_away(rabbitmq3):
    port = rabbitmq3.url.rsplit(":", 1)[1]
    refused = Daemon("--upstream", f"amqp://guest:{PASSWORD}@127.0.0.1:{port}", ready="reconnecting")
    away = Daemon("--upstream", f"amqp://guest:{PASSWORD}@127.0.0.1:{free_port()}", ready="reconnecting")
    for d in (refused, away):
        d.stop()
        assert "guest:***@" in d.log() or "guest" not in d.log(), d.log()
        assert_secret_free(d.log())


@pytest.mark.rabbitmq
def test_the_upstream_password_from_a_file_or_the_environment(rabbitmq3, tmp_path):
    host_port = rabbitmq3.url.rsplit("@", 1)[-1].split("//")[-1]
    bare = f"amqp://{host_port}"
    secret = tmp_path / "password"
    secret.write_text("guest\n")
    secret.chmod(0o600)
    for args, env in ((["--set", "upstream.user=guest", "--set", f"upstream.password_file={secret}"], {}),
                      (["--set", "upstream.user=guest"], {"BROKER_FILTER_UPSTREAM_PASSWORD": "guest"})):
        d = Daemon(*args, upstream=bare, env=env)  # waits for the upstream connection
        try:
            assert "connected (" in d.log()
        finally:
            d.stop()
    # Both at once, a missing or an empty file: refused, naming the setting.
    empty = tmp_path / "empty"
    empty.write_text("")
    for args, reason in (
        (["--set", "upstream.password=x", "--set", f"upstream.password_file={secret}"], "set one of them"),
        (["--set", f"upstream.password_file={tmp_path / 'nope'}"], "file not found"),
        (["--set", f"upstream.password_file={empty}"], "is empty"),
    ):
        out = serve("--set", "upstream.user=guest", *args, "--upstream", bare)
        assert out.returncode == 2 and out.stderr.startswith("broker-filter: config error: upstream.password_file: "), \
            out.stderr
        assert reason in out.stderr
    out = serve("--set", "upstream.user=guest", "--set", f"upstream.password_file={secret}", "--upstream", bare)
    assert out.returncode == 0 and json.loads(out.stdout)["upstream"]["password"] == "***"
    assert "guest\n" not in out.stdout


def test_a_config_file_readable_by_others_with_a_secret_is_warned_about(tmp_path):
    secret = f'[upstream]\nurls = ["amqp://rabbit"]\nuser = "bob"\npassword = "{PASSWORD}"\n'
    out = serve(config=secret, tmp_path=tmp_path, mode=0o644)
    assert out.returncode == 0, out.stderr
    assert "broker-filter: warning: the configuration file" in out.stderr
    assert "readable by others (mode 644)" in out.stderr and "upstream.password" in out.stderr
    assert_secret_free(out.stderr)
    # Its owner's alone, or with no secret in it: nothing to say.
    assert "warning" not in serve(config=secret, tmp_path=tmp_path, mode=0o600).stderr
    assert "warning" not in serve(config="[limits]\nconnections = 10\n", tmp_path=tmp_path, mode=0o644).stderr
    # A URL with a password, password hashes, a token: secrets too.
    for text, named in ((f'[upstream]\nurls = ["amqp://bob:{PASSWORD}@rabbit"]\n', "upstream.urls"),
                        (f'[metrics]\ntoken = "{PASSWORD}"\n', "metrics.token")):
        out = serve(config=text, tmp_path=tmp_path, mode=0o640)
        assert "readable by others" in out.stderr and named in out.stderr, out.stderr
        assert_secret_free(out.stderr)

"""Structured logs: context ids, text and JSON, secrets masked, bodies never logged."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest

from broker_filter import logs
from broker_filter.config import add_serve_arguments, load


@pytest.fixture
def stream():
    out = io.StringIO()
    yield out
    logs.unconfigure()


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_nothing_is_configured_at_import():
    code = (
        "import logging, broker_filter.logs, broker_filter.config, broker_filter.metrics, broker_filter.security;"
        "root = logging.getLogger(); print(len(root.handlers), root.level)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["0", str(logging.WARNING)]


def test_text_lines_carry_connection_and_link_ids(stream):
    logs.configure("text", "INFO", stream=stream)
    log = logs.bind("broker_filter.proxy", conn="c7").bind(link="l3")
    log.info("link attached", address="orders", credit=10)
    log.debug("not shown")
    logs.bind("broker_filter.proxy").info("plain %s", "args", note="two words")
    first, second = lines(stream)
    assert first.endswith("INFO broker_filter.proxy: link attached conn=c7 link=l3 address=orders credit=10")
    assert first[:4].isdigit() and first[23] == "Z"
    assert second.endswith('plain args note="two words"')


def test_json_lines(stream):
    logs.configure("json", "DEBUG", stream=stream)
    log = logs.bind(logging.getLogger("broker_filter.proxy"), conn="c1", link="l2")
    log.debug("delivery settled", outcome="accepted", count=3)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("callback failed")
    first, second = (json.loads(line) for line in lines(stream))
    assert first["level"] == "DEBUG" and first["logger"] == "broker_filter.proxy"
    assert (first["msg"], first["conn"], first["link"], first["outcome"], first["count"]) == (
        "delivery settled", "c1", "l2", "accepted", 3)
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exc"]


def test_secrets_are_masked_everywhere(stream):
    logs.configure("json", "INFO", stream=stream, secrets=["hunter2"])
    log = logs.bind("broker_filter.upstream", conn="u1")
    log.info("connecting to amqp://svc:swordfish@rabbit:5672/", upstream="amqps://a:b%40c@h")
    log.warning("login with password hunter2 refused")
    try:
        raise ConnectionError("amqp://svc:swordfish@rabbit:5672 refused (hunter2)")
    except ConnectionError:
        log.exception("upstream failed")
    text = stream.getvalue()
    for secret in ("swordfish", "hunter2", "b%40c"):
        assert secret not in text
    assert "amqp://svc:***@rabbit:5672/" in text
    assert "amqps://a:***@h" in text


def test_message_bodies_are_never_fields(stream):
    logs.configure("text", "INFO", stream=stream)
    logs.bind("broker_filter.proxy").info("delivery", body=b"secret payload", size=14)
    (line,) = lines(stream)
    assert "payload" not in line and "size=14" in line


def test_configure_replaces_its_own_handler_only(stream):
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    try:
        logs.configure("text", stream=stream)
        logs.configure("json", stream=stream)
        ours = [h for h in logging.getLogger().handlers if isinstance(h.formatter, logs._Formatter)]
        assert len(ours) == 1 and isinstance(ours[0].formatter, logs.JSONFormatter)
        assert other in logging.getLogger().handlers
    finally:
        logging.getLogger().removeHandler(other)
    with pytest.raises(ValueError):
        logs.configure("xml")


def test_configure_from_config_masks_configured_secrets(stream):
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--upstream", "amqp://bob:pa55word@rabbit", "--log-format", "json", "--log-level",
                              "warning"])
    config = load(args, {"BROKER_FILTER_UPSTREAM_USER": "svc", "BROKER_FILTER_UPSTREAM_PASSWORD": "t0psecret"})
    logs.configure_from(config, stream=stream)
    log = logging.getLogger("broker_filter.test")
    log.info("hidden by level")
    log.warning("tried t0psecret and pa55word")
    (line,) = lines(stream)
    assert json.loads(line)["msg"] == "tried *** and ***"


def test_ambient_context_is_resolved_only_for_lines_written(stream):
    logs.configure("json", "INFO", stream=stream)
    resolved = []

    def resolve(subject):
        resolved.append(subject)
        return {"conn": f"c{subject}", "link": "l9"}

    log = logging.getLogger("broker_filter.proxy")
    token = logs.enter(resolve, 7)
    try:
        log.debug("below the level: never resolved")
        log.info("inside")
        logs.bind(log, link="explicit").info("explicit ids win")
    finally:
        logs.leave(token)
    log.info("outside")
    inside, explicit, outside = (json.loads(line) for line in lines(stream))
    assert (inside["conn"], inside["link"]) == ("c7", "l9")
    assert (explicit["conn"], explicit["link"]) == ("c7", "explicit")
    assert "conn" not in outside and "link" not in outside
    assert resolved == [7, 7]


def test_a_failing_resolver_never_breaks_a_line(stream):
    logs.configure("text", "INFO", stream=stream)
    token = logs.enter(lambda subject: 1 / 0, None)
    try:
        logging.getLogger("broker_filter.proxy").info("still written")
    finally:
        logs.leave(token)
    assert lines(stream)[0].endswith("still written")

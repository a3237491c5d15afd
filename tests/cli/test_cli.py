"""The command line as a user runs it: a real subprocess of the installed console script."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).with_name("broker-filter")


def run(*args, stdin=None):
    cmd = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "broker_filter"]
    return subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONWARNINGS": "error"})


MESSAGES = [
    {"application_properties": {"color": "red", "qty": 5}},
    {"application_properties": {"color": "blue", "qty": 50}},
    {"properties": {"subject": "a.b"}},
]
LINES = "".join(json.dumps(m) + "\n" for m in MESSAGES)


def test_check_prints_the_canonical_form():
    r = run("check", "color='red'   and qty>2 or not x")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "color = 'red' AND qty > 2 OR NOT x"


def test_check_reports_the_error_with_a_caret():
    r = run("check", "a = 1 AND\nb LIKE 5")
    assert r.returncode == 2
    assert "line 2, column 8" in r.stderr
    lines = r.stderr.splitlines()
    assert lines[-2].strip() == "b LIKE 5" and lines[-1].index("^") == lines[-2].index("5")


def test_check_dialects():
    assert run("check", "--dialect", "rocketmq", "TagA || TagB").stdout.strip() == "TagA || TagB"
    assert run("check", "--dialect", "rocketmq", "a > 'x'").returncode == 2
    assert run("check", "--dialect", "artemis", '"my-prop" = 1').stdout.strip() == '"my-prop" = 1'


def test_match_prints_matching_lines_like_grep():
    r = run("match", "--selector", "qty > 10", stdin=LINES)
    assert r.returncode == 0
    assert [json.loads(x) for x in r.stdout.splitlines()] == [MESSAGES[1]]


def test_match_invert_count_and_explain():
    inv = run("match", "-v", "-s", "qty > 10", stdin=LINES)
    assert [json.loads(x) for x in inv.stdout.splitlines()] == [MESSAGES[0], MESSAGES[2]]
    count = run("match", "-c", "-s", "qty > 1", stdin=LINES)
    assert count.stdout.strip() == "2"
    explain = run("match", "--explain", "-s", "qty > 10", stdin=LINES)
    assert [line.split("\t")[0] for line in explain.stdout.splitlines()] == ["FALSE", "TRUE", "UNKNOWN"]


def test_match_no_selected_line_exits_1():
    r = run("match", "-s", "qty > 1000", stdin=LINES)
    assert r.returncode == 1 and r.stdout == ""


def test_match_reports_bad_lines_with_their_numbers_and_goes_on(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(LINES + "not json\n" + '{"header": {"priority": "high"}}\n' + json.dumps(MESSAGES[1]) + "\n")
    r = run("match", "-s", "qty > 10", str(f))
    assert r.returncode == 2
    assert f"{f}:4: not a valid message" in r.stderr
    assert f"{f}:5: not a valid message: header.priority" in r.stderr
    assert len(r.stdout.splitlines()) == 2


def test_match_with_a_filter_set(tmp_path):
    fs = {"t": {"descriptor": "apache.org:legacy-amqp-topic-binding:string", "value": "a.*"}}
    r = run("match", "--filter-set", json.dumps(fs), stdin=LINES)
    assert [json.loads(x) for x in r.stdout.splitlines()] == [MESSAGES[2]]
    path = tmp_path / "fs.json"
    path.write_text(json.dumps(fs))
    assert run("match", "--filter-set", f"@{path}", "-c", stdin=LINES).stdout.strip() == "1"


def test_match_invalid_selector_exits_2():
    r = run("match", "-s", "qty >", stdin=LINES)
    assert r.returncode == 2 and "invalid selector" in r.stderr


def test_match_invalid_filter_set_names_the_key():
    fs = {"h": {"descriptor": "apache.org:legacy-amqp-headers-binding:map", "value": {"x-match": "some"}}}
    r = run("match", "--filter-set", json.dumps(fs), stdin=LINES)
    assert r.returncode == 2 and "filter 'h'" in r.stderr and "x-match" in r.stderr


@pytest.mark.parametrize("module", [True, False])
def test_version_and_module_entry(module):
    cmd = [sys.executable, "-m", "broker_filter", "--version"] if module else [str(BIN), "--version"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("broker-filter ")


def test_check_and_match_take_the_amqp_sql_dialect():
    r = run("check", "--dialect", "amqp-sql", "[my key] != \"x\"   AND p.subject LIKE 'a%' AND n % 2 = 0x0A")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[my key] <> 'x' AND p.subject LIKE 'a%' AND n % 2 = 0x0A"
    r = run("check", "--dialect", "amqp-sql", "qty BETWEEN 1 AND 5")
    assert r.returncode == 2 and "no BETWEEN" in r.stderr and "line 1, column 5" in r.stderr
    assert run("check", "qty BETWEEN 1 AND 5").returncode == 0  # the JMS dialect has it
    r = run("match", "--dialect", "amqp-sql", "-s", "qty % 2 = 1 OR p.subject = \"a.b\"", stdin=LINES)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [MESSAGES[0], MESSAGES[2]]
    r = run("match", "--dialect", "amqp-sql", "-s", "color > 'q'", stdin=LINES)  # strings order in amqp-sql
    assert [json.loads(x) for x in r.stdout.splitlines()] == [MESSAGES[0]]


@pytest.mark.parametrize("value", ["container", "engine"])
def test_serve_with_the_retired_io_variable_exits_2_naming_it(value):
    cmd = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "broker_filter"]
    r = subprocess.run(cmd + ["serve", "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "BROKER_FILTER_IO": value})
    assert r.returncode == 2
    assert r.stderr.strip() == ("broker-filter: config error: environment variable BROKER_FILTER_IO: no longer read: "
                                "the daemon always runs on proton-c's engine (the `--io container` loop is gone); "
                                "unset it")
    assert "listening" not in r.stdout + r.stderr


def test_serve_refuses_the_retired_io_option():
    cmd = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "broker_filter"]
    r = subprocess.run(cmd + ["serve", "--listen", "127.0.0.1:0", "--io", "container"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert "unrecognized arguments: --io container" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_with_its_metrics_port_taken_exits_1_naming_the_setting():
    import socket

    cmd = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "broker_filter"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(cmd + ["serve", "--listen", "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"broker-filter: metrics.listen: cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr
    assert "Traceback" not in r.stderr

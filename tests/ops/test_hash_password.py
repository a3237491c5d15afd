"""`broker-filter hash-password` end to end: the printed hash logs a user in and loads as configuration."""

from __future__ import annotations

import subprocess
import sys

from broker_filter.config import load
from broker_filter.security import UserDatabase


def hash_cli(*args: str, password: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "broker_filter", "hash-password", *args],
        input=password + "\n", capture_output=True, text=True, timeout=60,
    )


def test_printed_hash_verifies_and_loads(tmp_path):
    result = hash_cli("--algorithm", "pbkdf2-sha256", password="correct horse")
    assert result.returncode == 0, result.stderr
    stored = result.stdout.strip()
    assert stored.startswith("$pbkdf2-sha256$") and "correct horse" not in result.stdout
    assert UserDatabase({"carol": stored}).authenticate("carol", "correct horse")
    path = tmp_path / "c.toml"
    path.write_text(f'[listener]\nhost = "0.0.0.0"\n[listener.users]\ncarol = "{stored}"\n')
    import argparse

    config = load(argparse.Namespace(config=str(path)), {})
    assert config.listener.effective_mechanisms == ("PLAIN",)


def test_empty_password_is_refused():
    result = hash_cli(password="")
    assert result.returncode == 2 and "empty password" in result.stderr and not result.stdout


def test_the_cost_is_an_option_and_bad_costs_say_the_range():
    result = hash_cli("--algorithm", "pbkdf2-sha256", "--cost", "20000", password="pw")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("$pbkdf2-sha256$i=20000$")
    assert UserDatabase({"carol": result.stdout.strip()}).authenticate("carol", "pw")
    result = hash_cli("--cost", "12", password="pw")
    assert result.returncode == 0 and result.stdout.startswith("$scrypt$ln=12,r=8,p=1$")
    result = hash_cli("--cost", "40", password="pw")
    assert result.returncode == 2 and not result.stdout
    assert "--cost: scrypt cost (log2 of N) must be within 10..22, not 40" in result.stderr

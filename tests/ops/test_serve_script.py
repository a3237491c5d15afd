"""The README's first command in a fresh clone: `bash scripts/serve.sh` installs the runtime into the
clone's own .venv (scripts/setup.sh --runtime-only) and serves.  About 10 s with pip's cache; the
first run on a machine also compiles python-qpid-proton (~25 s more)."""

from __future__ import annotations

import subprocess

from clients import filtered_round_trip
from launcher import ROOT, Daemon, free_port


def test_serve_script_in_a_fresh_clone_serves_and_stops_on_sigterm(tmp_path):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", head], check=True, timeout=60)
    assert not (clone / ".venv").exists()
    port = free_port()
    daemon = Daemon(program=["bash", "scripts/serve.sh"], listen=f"127.0.0.1:{port}", as_user=True, cwd=clone,
                    log_dir=tmp_path, start_timeout=240)
    try:
        daemon.wait_for(rf"listening on 127\.0\.0\.1:{port}\b", timeout=240)
        assert filtered_round_trip(f"amqp://127.0.0.1:{port}") == ["red"]
    finally:
        status = daemon.stop()
    assert status == 0, daemon.log()
    assert "Traceback" not in daemon.log()
    assert (clone / ".venv" / "bin" / "broker-filter").exists()

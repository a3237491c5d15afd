#!/usr/bin/env python3
"""Container health check: GET /healthz on the metrics listener of the configured broker-filter.

Reads the same configuration the daemon reads (BROKER_FILTER_CONFIG, BROKER_FILTER_* variables), so a
changed `metrics.listen` moves the probe with it.  Exit 0 when healthy, 1 otherwise.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def main() -> int:
    from broker_filter.config import ConfigError, load

    try:
        config = load(None)
    except ConfigError as e:
        print(f"unhealthy: config error: {e}", file=sys.stderr)
        return 1
    if not config.metrics.enabled:
        print("unhealthy: metrics.listen is empty, no health endpoint to probe", file=sys.stderr)
        return 1
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(config.metrics.host, config.metrics.host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{config.metrics.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (OSError, urllib.error.URLError) as e:
        print(f"unhealthy: {url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

# broker-filter: the filtering AMQP 1.0 proxy.  Build from the repository root:
#   docker build -t broker-filter .
#   podman build --format docker -t broker-filter .      (podman: --format docker keeps the HEALTHCHECK)
# Configuration: /etc/broker-filter/broker-filter.toml (mount your own), overridden by BROKER_FILTER_*
# environment variables.  Ports: 5672 (AMQP), 9464 (/metrics, /healthz, /readyz, /links).
# The metrics listener binds 0.0.0.0 here (the daemon's default is loopback) so that Prometheus and the
# health check reach it: publish the port only where scrapers are, and set BROKER_FILTER_METRICS_TOKEN
# (or metrics.token_file) for /links, which is refused on this listener without one.

# The same two scripts build and install the package in tests/ops/test_install.py.
# EXTRAS: optional features to include, e.g. `docker build --build-arg EXTRAS=journal .`

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=""
# python-qpid-proton is published as source: it compiles against OpenSSL here.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker_filter ./broker_filter
COPY scripts/build-wheels.sh scripts/install-wheels.sh ./scripts/
ENV PIP_NO_CACHE_DIR=1
# The wheels are installed here, into a virtualenv; the image copies only that virtualenv, so no layer
# of it holds the wheels (same base image in both stages: the virtualenv's python is the base's).
RUN sh scripts/build-wheels.sh /src /wheels "${EXTRAS}" \
    && python -m venv /opt/broker-filter \
    && PYTHON=/opt/broker-filter/bin/python sh scripts/install-wheels.sh /wheels "${EXTRAS}" \
    && /opt/broker-filter/bin/python -m pip uninstall --quiet --yes pip setuptools

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 broker-filter \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin broker-filter
COPY --from=build /opt/broker-filter /opt/broker-filter
COPY config/broker-filter.toml /etc/broker-filter/broker-filter.toml
COPY docker/healthcheck.py /usr/local/bin/broker-filter-healthcheck
ENV PATH=/opt/broker-filter/bin:$PATH \
    BROKER_FILTER_CONFIG=/etc/broker-filter/broker-filter.toml \
    BROKER_FILTER_LISTENER_HOST=0.0.0.0 \
    BROKER_FILTER_METRICS_LISTEN=0.0.0.0:9464 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 5672 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "/usr/local/bin/broker-filter-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["broker-filter"]
CMD ["serve"]

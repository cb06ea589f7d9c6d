# token-service image: `token-service serve` (gunicorn with token_service.server.gunicorn_conf, or
# granian with TOKEN_SERVICE_SERVER=granian behind a proxy: docs/deployment.md), as a non-root user.
#   docker build --build-arg VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' token_service/__init__.py)" \
#     -t token-service .
#   docker run --stop-timeout 20 -e TOKEN_SERVICE_REDIS_URL=redis://... -e TOKEN_SERVICE_API_KEYS=... \
#     -p 8000:8000 token-service
# --stop-timeout: on SIGTERM the instance drains (TOKEN_SERVICE_DRAIN_SECONDS, 5 s) and then
# gunicorn stops gracefully (graceful_timeout, 10 s): 15 s, above Docker's default of 10 s.
# BASE_IMAGE: any Python 3.12 image laid out like the official one (python and pip in
# /usr/local/bin, useradd); the image test builds on a local stand-in (docs/deployment.md).
ARG BASE_IMAGE=python:3.12-slim

# --- build: a virtual environment holding the service and exactly its locked dependencies ---
# (needs the network; nothing of this stage but /opt/venv reaches the image)
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The build backend, exactly as locked (versions and hashes), in an environment of its own.
COPY requirements/build.lock ./requirements/build.lock
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes -r requirements/build.lock
# The dependencies exactly as locked (versions and hashes), into the environment the image runs.
# Before the source is copied, so a change to the code does not download them again.
COPY requirements/server.lock ./requirements/server.lock
RUN python -m venv --without-pip /opt/venv \
 && pip --python /opt/venv/bin/python install --require-hashes --no-deps -r requirements/server.lock
COPY pyproject.toml README.md LICENSE openapi.yaml ./
COPY lua ./lua
COPY frontend/token-client.js ./frontend/token-client.js
COPY token_service ./token_service
# The service's wheel, built by the locked backend; installed with its server extra from no
# index, so a dependency of the extra that the lock lacks fails the build here. A VERSION that
# is not the wheel's fails it too: the label below never names another release.
ARG VERSION
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
 && set -- /tmp/dist/*.whl \
 && built="$(basename "$1" | cut -d- -f2)" \
 && if [ -n "$VERSION" ] && [ "$VERSION" != "$built" ]; then \
      echo "VERSION=$VERSION, but the wheel is version $built" >&2; exit 1; fi \
 && pip --python /opt/venv/bin/python install --no-index "$1[server,granian]" \
 && pip --python /opt/venv/bin/python check

# --- runtime: slim, no compiler, no build tools, no source tree, no root ---
FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PORT=8000 \
    TOKEN_SERVICE_DRAIN_SECONDS=5
# uid/gid 10001: a regular account (useradd --system warns above SYS_UID_MAX 999), no home,
# no lastlog/faillog entry (--no-log-init), no login shell.
RUN groupadd --gid 10001 app \
 && useradd --uid 10001 --gid app --no-create-home --no-log-init --shell /usr/sbin/nologin app
# One layer with the installed environment: no wheel files copied in and deleted later.
COPY --from=build /opt/venv /opt/venv
# VERSION: the package's version, for the label (the build command above passes it). Declared
# after the RUN steps, so a new version does not rebuild them or show in their history.
ARG VERSION
LABEL org.opencontainers.image.title="token-service" \
      org.opencontainers.image.version="${VERSION:-unknown}"
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# Liveness only (the process answers); Redis trouble is /readyz's business and a
# restart would not fix it. No curl in a slim image: Python's urllib does it.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8000'), timeout=2)"]
# `token-service serve` checks the settings, then runs the server TOKEN_SERVICE_SERVER names on
# 0.0.0.0:$PORT: gunicorn (the default) in this very process, or granian as its child, which it
# drains and stops; granian here needs TOKEN_SERVICE_TRUSTED_PROXY_HOPS (a proxy in front), or
# serve refuses to start. The shell only expands $PORT and is replaced (exec): SIGTERM reaches
# serve. Stop timeout must exceed drain (5 s) + graceful stop (10 s, either server).
STOPSIGNAL SIGTERM
CMD ["/bin/sh", "-c", "exec token-service serve --host 0.0.0.0 --port \"$PORT\""]

# token-service image: gunicorn with token_service.server.gunicorn_conf, as a non-root user.
#   docker build -t token-service .
#   docker run -e TOKEN_SERVICE_REDIS_URL=redis://... -e TOKEN_SERVICE_API_KEYS=... -p 8000:8000 token-service

# --- build: wheels of the service and its dependencies (needs the network, not shipped) ---
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md openapi.yaml ./
COPY requirements/server.lock ./requirements/server.lock
COPY lua ./lua
COPY frontend/token-client.js ./frontend/token-client.js
COPY token_service ./token_service
# the dependencies exactly as locked (versions and hashes), then the service itself
RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels -r requirements/server.lock \
 && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- runtime: slim, no compiler, no source tree, no root ---
FROM python:3.12-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PORT=8000 \
    TOKEN_SERVICE_DRAIN_SECONDS=5
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --no-create-home --shell /usr/sbin/nologin app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "idempotency-token-service[server]" \
 && rm -rf /wheels
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# Liveness only (the process answers); Redis trouble is /readyz's business and a
# restart would not fix it. No curl in a slim image: Python's urllib does it.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8000'), timeout=2)"]
# gunicorn binds 0.0.0.0:$PORT. Stop timeout must exceed drain (5 s) + graceful_timeout (10 s).
STOPSIGNAL SIGTERM
CMD ["gunicorn", "--config", "python:token_service.server.gunicorn_conf", "token_service:create_app()"]

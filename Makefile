# The two commands of the README:
#   make run    — the service on http://127.0.0.1:8000 (PORT=... to change it; embedded store unless
#                 TOKEN_SERVICE_REDIS_URL is set)
#   make test   — lint, type-check, the docs build and the whole test suite (fakeredis and real redis-server)
# and, while developing, make check — lint, type-check and the tests not marked slow (docs/testing.md).
# Both create .venv and install the project into it on first use, from requirements/dev.lock
# (make lock refreshes it after a change to pyproject.toml's dependencies).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# mkdocs-material prints an advert on every build without this.
export NO_MKDOCS_2_WARNING := 1
# make run's development key, so the curl walk-through works out of the box. The service takes it
# on the embedded store only; against a real Redis (TOKEN_SERVICE_REDIS_URL) set a key of your own,
# or TOKEN_SERVICE_ENVIRONMENT=development on a development machine (docs/configuration.md).
DEV_API_KEY := dev-service-key-change-me

.PHONY: run test check lint docs-build docs install lock clean bench example-fastapi example-django

# Installs are reproducible: the pinned, hashed dependencies of requirements/dev.lock
# first, then the project itself without resolving anything. A lock older than
# pyproject.toml's dependencies stops here, saying so; `make lock` writes a new one.
LOCK := requirements/dev.lock

$(BIN)/token-service: pyproject.toml $(LOCK)
	$(PYTHON) requirements/lock.py check
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

install: $(BIN)/token-service

# After changing dependencies in pyproject.toml: resolve again (uv, over the network),
# then commit requirements/*.lock. The Dockerfile installs from requirements/server.lock.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m uv --version >/dev/null 2>&1 || $(BIN)/pip install --quiet uv
	$(BIN)/python requirements/lock.py write

# Log lines for a person at a terminal (the embedded store's warning stands out); JSON elsewhere.
run: install
	TOKEN_SERVICE_API_KEYS=$${TOKEN_SERVICE_API_KEYS-$(DEV_API_KEY)} \
	TOKEN_SERVICE_LOG_FORMAT=$${TOKEN_SERVICE_LOG_FORMAT:-console} \
	  $(BIN)/token-service serve --host $${HOST:-127.0.0.1} --port $${PORT:-8000}

# The runnable examples of docs/integrations/, each on its own port (PORT=... to change it),
# against the Redis of TOKEN_SERVICE_REDIS_URL (default redis://127.0.0.1:6379/0).
example-fastapi: install
	$(BIN)/python -m examples.fastapi_app

example-django: install
	$(BIN)/python -m examples.django_app

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# make test and make check run on PYTEST_WORKERS processes (pytest-xdist); a test file never leaves
# its worker and files that share something run one after another (tests/conftest.py,
# docs/testing.md). Most tests wait on subprocesses and sockets, so 3 on 2 cores;
# PYTEST_WORKERS=0 runs the suite serially, in one process.
PYTEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)

test: lint docs-build
	$(BIN)/pytest $(XDIST) --durations=30 $(PYTEST_ARGS)

# The loop while developing (docs/testing.md): lint, types and the tests not marked slow, the
# property tests on their quick profile; make test before landing.
check: lint
	PROPS_PROFILE=$${PROPS_PROFILE:-quick} $(BIN)/pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/): built --strict by make test, served by make docs.
docs-build: install
	$(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

docs: install
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:$${DOCS_PORT:-8001}

# The performance suite (about 12 minutes): writes benchmarks/RESULTS.md and results.png.
bench: install
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

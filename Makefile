# Two entry points: `make run` (try it, SQLite unless DATABASE_URL is set) and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST_PG := postgres://postgres@127.0.0.1:5432/eventdrop

BENCH_INGRESS_JSON ?= /tmp/eventdrop_bench_ingress.json

.PHONY: run test lint typecheck bench clean install

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} ./scripts/run-local.sh

# mypy (config and strictness: pyproject.toml [tool.mypy]) runs between ruff and pytest, so
# `make test` (and CI, which runs it) fails on a type error; `make typecheck` runs it alone.
TYPECHECK := $(PY) -m mypy

# DATABASE_URL wins; else a PostgreSQL answering on 127.0.0.1:5432; else SQLite, with the
# PostgreSQL-only tests skipped and the reason printed in the summary.
test: $(STAMP)
	@if [ -z "$$DATABASE_URL" ] && $(PY) -c "import socket; socket.create_connection(('127.0.0.1', 5432), 1)" 2>/dev/null; then \
		echo "make test: using PostgreSQL at $(HOST_PG)"; export DATABASE_URL=$(HOST_PG); \
	elif [ -z "$$DATABASE_URL" ]; then echo "make test: no PostgreSQL on 127.0.0.1:5432, using SQLite"; fi; \
	$(PY) -m ruff check . && $(TYPECHECK) && $(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check . && $(TYPECHECK)

typecheck: $(STAMP)
	$(PY) -m mypy

bench: $(STAMP)
	@# bench/ingress_ack.py installs wrk (apt-get update, then install) when it is missing.
	$(PY) bench/ingress_ack.py --connections 16 1 --slow-clients 32 --json-out $(BENCH_INGRESS_JSON)
	$(PY) bench/inbox_throughput.py --events 50000 --workers 2 --ingress-json $(BENCH_INGRESS_JSON)

clean:
	rm -rf $(VENV) db.sqlite3 db.sqlite3-wal db.sqlite3-shm  # .env stays (it holds your key and ports)

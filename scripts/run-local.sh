#!/usr/bin/env bash
# `make run`: check the ports, write .env on first use, find or start PostgreSQL, migrate,
# then the web server, the django-q2 cluster, the inbox worker, the dispatcher, the fake
# render service and the fake Stripe, all in the foreground; Ctrl-C stops them all (and the
# embedded PostgreSQL, when this run started it).
#
# Configuration is .env (from .env.example; real environment variables win), read by the
# settings of every process — and of every manage.py command in any other shell.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"
export PYTHONUNBUFFERED=1  # the processes' lines interleave in the order they happen

if [ "${1:-}" != --with-database ]; then
  # Before anything starts: a busy port is one line naming it, not a traceback later.
  ports=$($PY scripts/localdev.py ports) || exit 1
  read -r PORT FAKE_RENDERER_PORT FAKE_STRIPE_PORT <<<"$ports"
  export PORT FAKE_RENDERER_PORT FAKE_STRIPE_PORT
  $PY scripts/localdev.py ensure-env
  # The rest of this script runs on the settings' PostgreSQL: DATABASE_URL, or the one on
  # 127.0.0.1:LOCAL_POSTGRES_PORT, or an embedded one started there until this run ends.
  exec $PY scripts/localdb.py run -- bash scripts/run-local.sh --with-database
fi

# The system checks once, here; every process below skips them (they would print each
# warning once per process).
$PY manage.py check
$PY manage.py migrate --noinput --skip-checks
$PY manage.py ensure_schedules --skip-checks
$PY manage.py raw_event_partitions --skip-checks

# Each process in a process group of its own (job control): Ctrl-C reaches this script
# only, and each process is stopped once, as a whole, below. (A signal to every process of
# django-q2's cluster at once leaves its parent waiting for children that are gone.)
set -m
pids=()
stop_all() {
  trap - EXIT INT TERM
  kill "${pids[@]}" 2>/dev/null || true
  wait  # until every one has stopped (Ctrl-C again gives up waiting)
}
trap stop_all EXIT INT TERM
$PY manage.py run_fake_renderer --port "$FAKE_RENDERER_PORT" & pids+=($!)
$PY manage.py run_fake_stripe --port "$FAKE_STRIPE_PORT" & pids+=($!)
$PY manage.py qcluster --skip-checks & pids+=($!)
$PY manage.py process_inbox --skip-checks & pids+=($!)
# Its own lines say what each pass did; the run log of every idle second is not news.
LOG_LEVEL=WARNING $PY manage.py dispatch_side_effects --skip-checks & pids+=($!)
cat <<BANNER
EventDrop on http://127.0.0.1:$PORT/  (console /admin/, ops /ops/)
  fake render service http://127.0.0.1:$FAKE_RENDERER_PORT/   fake Stripe http://127.0.0.1:$FAKE_STRIPE_PORT/
  in another shell:  .venv/bin/python manage.py createsuperuser
                     .venv/bin/python manage.py demo     (a free and a paid recap, to ready)
BANNER
# The production web server (the Procfile's web line: the receive path providers hit),
# one process, restarted when a source file changes.
WEB_RELOAD=1 WEB_CONCURRENCY=1 $PY -m eventdrop.web & pids+=($!)
wait -n

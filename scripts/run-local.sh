#!/usr/bin/env bash
# `make run`: migrate, then the web server, the django-q2 cluster, the inbox worker and the
# fake render service, all in the foreground; Ctrl-C stops them all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"
# Local-only defaults so every flow works out of the box; real deployments set their own.
export STRIPE_WEBHOOK_SECRET="${STRIPE_WEBHOOK_SECRET:-whsec_local_stripe_secret}"
export GITHUB_WEBHOOK_SECRET="${GITHUB_WEBHOOK_SECRET:-local-github-secret}"
export SLACK_SIGNING_SECRET="${SLACK_SIGNING_SECRET:-local-slack-secret}"
export RENDERER_WEBHOOK_SECRET="${RENDERER_WEBHOOK_SECRET:-whsec_bG9jYWwtcmVuZGVyZXItc2VjcmV0LWtleQ==}"
export RENDER_SERVICE_URL="${RENDER_SERVICE_URL:-http://127.0.0.1:8200}"
export RENDER_CALLBACK_URL="${RENDER_CALLBACK_URL:-http://127.0.0.1:8000/webhooks/renderer/}"

$PY manage.py migrate --noinput
$PY manage.py ensure_schedules
$PY manage.py raw_event_partitions

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
$PY manage.py run_fake_renderer --port 8200 & pids+=($!)
$PY manage.py qcluster & pids+=($!)
$PY manage.py process_inbox & pids+=($!)
echo "EventDrop on http://127.0.0.1:8000/ (admin at /admin/; create a user with: $PY manage.py createsuperuser)"
$PY manage.py runserver 127.0.0.1:8000 & pids+=($!)
wait -n

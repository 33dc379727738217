"""The production web server's configuration (eventdrop/web.py) and its start-up checks."""

import pytest
from django.core import checks

from eventdrop.web import WebServerConfig
from ingress.sources import reset_sources_cache


def server_messages() -> list[checks.CheckMessage]:
    # Through the registry, so the test also proves the check is registered.
    return [m for m in checks.run_checks() if m.id in ("ingress.E003", "ingress.W002")]


@pytest.fixture
def environ(monkeypatch):
    reset_sources_cache()
    yield monkeypatch
    monkeypatch.undo()
    reset_sources_cache()


def test_binds_loopback_unless_told_otherwise():
    assert WebServerConfig.from_environ({}).host == "127.0.0.1"
    assert WebServerConfig.from_environ({"HOST": "10.0.0.5"}).host == "10.0.0.5"
    assert WebServerConfig.from_environ({"WEB_BIND": "0.0.0.0", "HOST": "x"}).host == "0.0.0.0"  # noqa: S104


def test_port_processes_threads_and_header_bounds_come_from_the_environment():
    config = WebServerConfig.from_environ(
        {"PORT": "5001", "WEB_CONCURRENCY": "3", "WEB_THREADS": "8",
         "WEB_HEADER_READ_TIMEOUT_SECONDS": "2.5", "WEB_MAX_HEADER_BYTES": "100",
         "WEB_KEEP_ALIVE_SECONDS": "30"}
    )
    assert (config.port, config.processes, config.threads) == (5001, 3, 8)
    assert config.header_read_timeout_seconds == 2.5
    assert config.max_header_bytes == 8192  # never below what every provider's head fits in
    assert config.keep_alive_seconds == 30
    assert WebServerConfig.from_environ({}).keep_alive_seconds == 75


def test_defaults_fit_the_webhook_budget(environ):
    assert server_messages() == []


def test_body_read_deadline_past_the_budget_fails_the_check(environ, settings):
    settings.WEBHOOK_BODY_READ_TIMEOUT_SECONDS = 28.0

    messages = server_messages()

    assert [(m.id, m.level) for m in messages] == [("ingress.E003", checks.ERROR)]
    assert "body 28.0 s (WEBHOOK_BODY_READ_TIMEOUT_SECONDS)" in messages[0].msg
    assert "exceeds the 30.0 s budget" in messages[0].msg


def test_header_read_timeout_counts_against_the_budget(environ):
    environ.setenv("WEB_HEADER_READ_TIMEOUT_SECONDS", "25")

    messages = server_messages()

    assert [m.id for m in messages] == ["ingress.E003"]
    assert "headers 25.0 s" in messages[0].msg


@pytest.mark.parametrize(
    ("variable", "value"),
    [("WEB_THREADS", "many"), ("WEB_THREADS", "0"), ("WEB_HEADER_READ_TIMEOUT_SECONDS", "61"),
     ("WEB_KEEP_ALIVE_SECONDS", "-1")],
)
def test_malformed_server_setting_fails_the_check(environ, variable, value):
    environ.setenv(variable, value)

    assert [m.id for m in server_messages()] == ["ingress.E003"]


def test_source_header_limit_above_the_servers_is_warned_about(environ):
    environ.setenv("WEBHOOK_STRIPE_MAX_HEADER_BYTES", str(128 * 1024))
    reset_sources_cache()

    messages = server_messages()

    assert [(m.id, m.level) for m in messages] == [("ingress.W002", checks.WARNING)]
    assert "'stripe'" in messages[0].msg and "65536" in messages[0].msg


def test_concurrent_requests_per_process_are_capped_explicitly():
    # A cap somebody chose: what the bodies in flight may hold in memory is this many times
    # the body limit, per process (tests/ingress/test_receive_framing.py drives it).
    assert WebServerConfig.from_environ({}).max_concurrent_requests == 64
    assert WebServerConfig.from_environ(
        {"WEB_MAX_CONCURRENT_REQUESTS": "16"}
    ).max_concurrent_requests == 16
    with pytest.raises(ValueError, match="WEB_MAX_CONCURRENT_REQUESTS"):
        WebServerConfig.from_environ({"WEB_THREADS": "8", "WEB_MAX_CONCURRENT_REQUESTS": "4"})


def _call(handler, path: str, **extra) -> tuple[int, dict[str, str]]:
    from django.test import RequestFactory

    environ = RequestFactory().generic(
        "POST", path, b'{"id": "evt_lean"}', content_type="application/json", **extra
    ).environ
    answer: dict = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = int(status.split()[0])
        answer["headers"] = dict(headers)

    b"".join(handler(environ, start_response))
    return answer["status"], answer["headers"]


def _stripe_headers(body: bytes) -> dict[str, str]:
    return {"Host": "testserver", "Content-Type": "application/json",
            "Content-Length": str(len(body)), "Stripe-Signature": "t=1,v1=00"}


def _respond(app, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str]]:
    import asyncio

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }

    async def respond_and_close():
        from ingress.store import raw_rows_on_loop

        try:
            return await app.respond(scope, body)
        finally:
            await raw_rows_on_loop.aclose()

    status, answer_headers, _ = asyncio.run(respond_and_close())
    return status, {name.decode(): value.decode() for name, value in answer_headers}


@pytest.mark.django_db(transaction=True)
def test_webhooks_run_behind_only_the_middleware_they_need():
    from django.core.handlers.wsgi import WSGIHandler

    from eventdrop.web import WebhooksOnTheLoop
    from ingress.models import RawEvent

    on_the_loop = WebhooksOnTheLoop(store_connections=1)
    body = b'{"id": "evt_lean"}'
    signed = _stripe_headers(body)
    status, headers = _respond(on_the_loop, "/webhooks/stripe/", signed, body)
    assert status == 202
    assert bytes(RawEvent.objects.get().body) == body
    # Security headers stay; the clickjacking header (a page's) and the session do not.
    assert headers["x-content-type-options"] == "nosniff"
    assert "x-frame-options" not in headers
    full_stack = _call(WSGIHandler(), "/webhooks/stripe/", HTTP_STRIPE_SIGNATURE="t=1,v1=00")
    assert "X-Frame-Options" in full_stack[1]
    # The Host check (CommonMiddleware) still answers 400 before anything is stored.
    evil = {**signed, "Host": "evil.example"}
    assert _respond(on_the_loop, "/webhooks/stripe/", evil, body)[0] == 400
    assert RawEvent.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_request_signals_reach_every_receiver_but_djangos_own_housekeeping():
    from django.core import signals

    from eventdrop.web import WebhooksOnTheLoop

    on_the_loop = WebhooksOnTheLoop(store_connections=1)
    body = b'{"id": "evt_signals"}'
    signed = _stripe_headers(body)
    seen: list[str] = []

    def started(sender, **kwargs):
        seen.append("started")

    def finished(sender, **kwargs):
        seen.append("finished")

    assert not on_the_loop._started.has_work() and not on_the_loop._finished.has_work()
    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        assert _respond(on_the_loop, "/webhooks/stripe/", signed, body)[0] == 202
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)
    assert seen == ["started", "finished"]
    # Only Django's own receivers again: nothing is sent, nothing else changes.
    assert _respond(on_the_loop, "/webhooks/stripe/", signed, body)[0] == 202
    assert seen == ["started", "finished"]


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "text/plain; charset=latin-1",
     "application/x-www-form-urlencoded; charset=no-such-codec", ""],
)
def test_the_webhook_request_reads_content_type_as_django_does(content_type):
    from django.core.handlers.wsgi import WSGIRequest
    from django.test import RequestFactory

    from eventdrop.web import _webhook_request_class

    environ = RequestFactory().generic("POST", "/webhooks/stripe/?n=%E9", b"{}").environ
    environ["CONTENT_TYPE"] = content_type
    webhook_request, django = _webhook_request_class(), WSGIRequest(environ)
    for _ in range(2):  # the second parse comes from the cache
        lean = webhook_request(environ)
        assert (lean.content_type, lean.content_params, lean.encoding) == (
            django.content_type, django.content_params, django.encoding
        )
        # The query string is decoded with that encoding, as Django's own request does.
        assert lean.GET == django.GET


@pytest.mark.django_db(transaction=True)
def test_a_webhook_route_is_resolved_once_and_a_path_that_is_none_is_404_every_time():
    from eventdrop.web import WebhooksOnTheLoop
    from ingress.models import RawEvent

    on_the_loop = WebhooksOnTheLoop(store_connections=1)
    body = b'{"id": "evt_resolved"}'
    signed = _stripe_headers(body)
    for path in ("/webhooks/stripe/", "/webhooks/stripe/", "/webhooks/stripe"):
        assert _respond(on_the_loop, path, signed, body)[0] == 202
    for _ in range(2):
        assert _respond(on_the_loop, "/webhooks/stripe/x/", signed, body)[0] == 404
    resolved = on_the_loop.chain.route.cache_info()
    assert (resolved.hits, resolved.misses, resolved.currsize) == (1, 4, 2)
    assert RawEvent.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_an_exception_in_the_view_is_djangos_500_and_the_middleware_still_answer(
    monkeypatch, caplog
):
    import ingress.views
    from eventdrop.web import WebhooksOnTheLoop

    def broken(request, source_name):
        raise RuntimeError("a bug in the receive path")

    monkeypatch.setattr(ingress.views, "_admit", broken)
    on_the_loop = WebhooksOnTheLoop(store_connections=1)
    body = b'{"id": "evt_broken"}'
    with caplog.at_level("ERROR", logger="django.request"):
        status, headers = _respond(on_the_loop, "/webhooks/stripe/", _stripe_headers(body), body)
    # response_for_exception's 500 (logged with the exception), then every layer's
    # process_response as in Django's chain: the security headers are on the error too.
    assert status == 500
    assert headers["x-content-type-options"] == "nosniff"
    assert [record.exc_info[0] for record in caplog.records if record.exc_info] == [RuntimeError]


@pytest.mark.django_db(transaction=True)
def test_a_refused_request_is_logged_as_django_logs_it(caplog):
    from eventdrop.web import WebhooksOnTheLoop

    on_the_loop = WebhooksOnTheLoop(store_connections=1)
    body = b'{"id": "evt_unsigned"}'
    unsigned = {**_stripe_headers(body)}
    del unsigned["Stripe-Signature"]
    with caplog.at_level("WARNING", logger="django.request"):
        assert _respond(on_the_loop, "/webhooks/stripe/", unsigned, body)[0] == 400
    assert [record.getMessage() for record in caplog.records] == [
        "Bad Request: /webhooks/stripe/"
    ]


def test_the_webhook_chain_refuses_what_it_does_not_run(settings, monkeypatch):
    from django.conf import settings as live_settings
    from django.core.exceptions import ImproperlyConfigured

    import eventdrop.web
    from eventdrop.web import WEBHOOK_URLCONF, WebhookChain

    # A middleware with a view hook: a chain of request and response hooks would skip it.
    view_hook = "tests.ingress.test_receive_server.ViewHook"
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, view_hook]
    monkeypatch.setattr(
        eventdrop.web, "WEBHOOK_MIDDLEWARE", eventdrop.web.WEBHOOK_MIDDLEWARE | {view_hook}
    )
    with pytest.raises(ImproperlyConfigured, match="process_view"):
        WebhookChain(urlconf=WEBHOOK_URLCONF)
    monkeypatch.undo()
    # ATOMIC_REQUESTS cannot wrap a coroutine view (Django refuses it as well).
    monkeypatch.setitem(live_settings.DATABASES["default"], "ATOMIC_REQUESTS", True)
    with pytest.raises(ImproperlyConfigured, match="ATOMIC_REQUESTS"):
        WebhookChain(urlconf=WEBHOOK_URLCONF)


class ViewHook:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view, args, kwargs):
        return None


def test_the_host_check_is_djangos_verdict_kept_per_host_until_settings_change(settings):
    from django.core.exceptions import DisallowedHost
    from django.test import RequestFactory

    from eventdrop.web import _webhook_request_class

    settings.ALLOWED_HOSTS = ["hooks.example"]
    webhook_request = _webhook_request_class()

    def host(value):
        return webhook_request(RequestFactory().post("/webhooks/stripe/", HTTP_HOST=value).environ)

    for _ in range(2):  # the second answer comes from the kept verdict
        assert host("hooks.example").get_host() == "hooks.example"
        with pytest.raises(DisallowedHost):  # a refused host is checked every time
            host("evil.example").get_host()
    settings.ALLOWED_HOSTS = ["other.example"]  # a verdict kept before no longer holds
    with pytest.raises(DisallowedHost):
        host("hooks.example").get_host()

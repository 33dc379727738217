"""Who may call which console endpoint, as a table, with real credentials on every request.

Every endpoint is called by every identity with the credentials a script or browser would
really send (a knox token in `Authorization: Token …`, HTTP Basic, or nothing), never with
force_authenticate: the table proves the authentication classes as well as the permissions.
Then the refusals that keep another site from driving the API: form posts, cross-site
origins, session writes without the CSRF token.
"""

import base64
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from console.models import BulkJob, OperatorAction
from ingress.inbox import inbox_run_once
from ingress.models import Delivery
from outbox.models import RecapSideEffect
from tests.console.conftest import grant, receive_github
from tests.console.samples import side_effect, verified_event

pytestmark = pytest.mark.django_db

VIEW_PERMISSIONS = (
    "ingress.view_rawevent",
    "ingress.view_delivery",
    "outbox.view_recapsideeffect",
    "recaps.view_recapvideo",
    "console.view_operatoraction",
    "console.view_ops",
)
IDENTITIES = {
    # name: (is_staff, is_superuser, permissions)
    "non_staff": (False, False, (*VIEW_PERMISSIONS, "ingress.view_raw_payload", "console.operate")),
    "staff_without_perms": (True, False, ()),
    "viewer": (True, False, VIEW_PERMISSIONS),
    "payload_reader": (True, False, (*VIEW_PERMISSIONS, "ingress.view_raw_payload")),
    "operator": (True, False, (*VIEW_PERMISSIONS, "console.operate")),
    "superuser": (True, True, ()),
}
UNAUTHENTICATED = ("anonymous", "bad_token", "basic_auth_of_superuser")
ALL = (*UNAUTHENTICATED, *IDENTITIES)

VIEWERS = {"viewer", "payload_reader", "operator", "superuser"}
# Which identities each permission admits (superusers have every permission); "" is staff.
ADMITS = {
    "": {"staff_without_perms", *VIEWERS},
    "ingress.view_rawevent": VIEWERS,
    "ingress.view_delivery": VIEWERS,
    "outbox.view_recapsideeffect": VIEWERS,
    "recaps.view_recapvideo": VIEWERS,
    "console.view_ops": VIEWERS,
    "console.view_operatoraction": VIEWERS,
    "ingress.view_raw_payload": {"payload_reader", "superuser"},
    "console.operate": {"operator", "superuser"},
}
# The group the objects fixture leaves behind: its rejected event.
INCIDENT = {"kind": "rejected_events", "scope": "github", "error_class": "bad_signature"}
DEAD_SIDE_EFFECTS = {"kind": "dead_side_effects", "scope": "render", "error_class": "http_500"}

# name: (method, path with {event}/{side_effect}/{recap}/{delivery}, JSON body, the
# permission it needs[, the status it answers those it admits: 200 unless said])
ENDPOINTS: dict[str, tuple[Any, ...]] = {
    "root": ("get", "/api/", None, ""),
    "schema": ("get", "/api/schema/", None, ""),
    "raw_event_list": ("get", "/api/raw-events/", None, "ingress.view_rawevent"),
    "raw_event_list_with_payload": (
        "get",
        "/api/raw-events/?include_payload=true",
        None,
        "ingress.view_raw_payload",
    ),
    "raw_event_body_search": (
        "get",
        "/api/raw-events/?body_contains=sample",
        None,
        "ingress.view_raw_payload",
    ),
    "raw_event_detail": ("get", "/api/raw-events/{event}/", None, "ingress.view_rawevent"),
    "delivery_list": ("get", "/api/deliveries/?status=pending", None, "ingress.view_delivery"),
    "delivery_detail": ("get", "/api/deliveries/{delivery}/", None, "ingress.view_delivery"),
    "side_effect_list": ("get", "/api/side-effects/", None, "outbox.view_recapsideeffect"),
    "side_effect_detail": (
        "get",
        "/api/side-effects/{side_effect}/",
        None,
        "outbox.view_recapsideeffect",
    ),
    "recap_list": ("get", "/api/recaps/", None, "recaps.view_recapvideo"),
    "recap_detail": ("get", "/api/recaps/{recap}/", None, "recaps.view_recapvideo"),
    "incident_list": ("get", "/api/incidents/", None, "console.view_ops"),
    "incident_acknowledge": ("post", "/api/incidents/acknowledge/", INCIDENT, "console.operate"),
    "incident_resolve": ("post", "/api/incidents/resolve/", INCIDENT, "console.operate"),
    "incident_rearm": (
        "post",
        "/api/incidents/rearm/",
        DEAD_SIDE_EFFECTS,
        "console.operate",
        201,
    ),
    "queue_depths": ("get", "/api/queues/", None, "console.view_ops"),
    "region_list": ("get", "/api/regions/", None, "console.view_ops"),
    # One region here: admitted, and told there is nothing to switch (400, nothing recorded).
    "processing_region": (
        "post",
        "/api/regions/processing/",
        {"region": "us", "reason": "drill"},
        "console.operate",
        400,
    ),
    "operator_actions": ("get", "/api/operator-actions/", None, "console.view_operatoraction"),
    "replay": ("post", "/api/raw-events/replay/", {"ids": ["{event}"]}, "console.operate"),
    "reverify": ("post", "/api/raw-events/reverify/", {"ids": ["{event}"]}, "console.operate"),
    # The event is not questioned: admitted, run, and its refusal recorded (200).
    "accept_repeat": (
        "post",
        "/api/raw-events/accept-repeat/",
        {"ids": ["{event}"], "reason": "GitHub lists it"},
        "console.operate",
    ),
    "reject_repeat": (
        "post",
        "/api/raw-events/reject-repeat/",
        {"ids": ["{event}"], "reason": "GitHub does not list it"},
        "console.operate",
    ),
    "rearm": ("post", "/api/side-effects/rearm/", {"ids": ["{side_effect}"]}, "console.operate"),
    # The delivery is neither dead nor orphaned: admitted, run, and its refusal recorded (200).
    "delivery_rearm": (
        "post",
        "/api/deliveries/rearm/",
        {"ids": ["{delivery}"]},
        "console.operate",
    ),
    "mark_dead": (
        "post",
        "/api/side-effects/mark-dead/",
        {"ids": ["{side_effect}"], "reason": "customer asked to cancel"},
        "console.operate",
    ),
    "retry_render": (
        "post",
        "/api/recaps/retry-render/",
        {"ids": ["{recap}"]},
        "console.operate",
    ),
}


def expected_status(endpoint: str, identity: str) -> int:
    if identity in UNAUTHENTICATED:
        return 401
    permission, *success = ENDPOINTS[endpoint][3:]
    return (success or [200])[0] if identity in ADMITS[permission] else 403


TABLE = [
    pytest.param(
        endpoint, identity, expected_status(endpoint, identity), id=f"{endpoint}-{identity}"
    )
    for endpoint in ENDPOINTS
    for identity in ALL
]


def make_user(name: str):
    is_staff, is_superuser, permissions = IDENTITIES[name]
    user = get_user_model().objects.create_user(
        name, password=f"pw-{name}", is_staff=is_staff, is_superuser=is_superuser
    )
    return grant(user, *permissions)


def token_for(user) -> str:
    _, token = AuthToken.objects.create(user)
    return token


def credentials(identity: str) -> dict:
    if identity == "anonymous":
        return {}
    if identity == "bad_token":
        return {"HTTP_AUTHORIZATION": "Token " + "0" * 64}
    if identity == "basic_auth_of_superuser":
        make_user("superuser")
        basic = base64.b64encode(b"superuser:pw-superuser").decode()
        return {"HTTP_AUTHORIZATION": f"Basic {basic}"}
    return {"HTTP_AUTHORIZATION": f"Token {token_for(make_user(identity))}"}


@pytest.fixture
def objects(client, admin_user):
    event = verified_event(client, admin_user)
    row = side_effect(client, admin_user)
    # A second render row, dead (its recap's), and a rejected event: two incidents.
    other = side_effect(client, admin_user)
    RecapSideEffect.objects.filter(pk=other.pk).update(
        status="dead",
        last_error_class="http_500",
        last_error="500 Internal Server Error",
        finished_at=timezone.now(),
    )
    receive_github(client, {"zen": "forged"}, delivery="forged-1", secret="not-the-secret")
    inbox_run_once()
    delivery = Delivery.objects.create(raw_event_id=event.pk, handler="console.table.handler")
    return {
        "event": event.pk,
        "side_effect": row.pk,
        "recap": str(row.recap_id),
        "delivery": delivery.pk,
    }


def _fill(value, objects):
    if isinstance(value, str):
        filled = value.format(**objects)
        return int(filled) if filled.isdigit() else filled
    if isinstance(value, list):
        return [_fill(item, objects) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, objects) for key, item in value.items()}
    return value


def call(endpoint: str, objects: dict, headers: dict, api: APIClient | None = None):
    method, path, body = ENDPOINTS[endpoint][:3]
    api = api or APIClient()
    url = path.format(**objects)
    if method == "get":
        return api.get(url, **headers)
    return api.post(url, _fill(body, objects), format="json", **headers)


@pytest.mark.parametrize(("endpoint", "identity", "status"), TABLE)
def test_permission_table(endpoint, identity, status, objects):
    response = call(endpoint, objects, credentials(identity))
    assert response.status_code == status, response.content
    if status >= 400:
        # Every refusal in one shape: RFC 9457 problem details.
        assert response["Content-Type"] == "application/problem+json"
        problem = response.json()
        assert problem["status"] == status and problem["type"].startswith("urn:eventdrop:")
        assert {"title", "detail"} <= set(problem)
    else:
        assert response["Content-Type"].startswith(
            "application/vnd.oai.openapi+json" if endpoint == "schema" else "application/json"
        )
    if status == 401:
        # A client told to authenticate is told how.
        assert response["WWW-Authenticate"] == "Token"
    if status >= 400:
        assert not OperatorAction.objects.exists() and not BulkJob.objects.exists()
    elif endpoint == "incident_rearm":
        assert BulkJob.objects.get().actor_username == identity
    elif ENDPOINTS[endpoint][0] == "post":
        assert OperatorAction.objects.get().actor_username == identity


def test_every_console_endpoint_is_in_the_table():
    from console import urls
    from tests.console.test_bulk_jobs_api import ROUTES as JOB_ROUTES  # tabled there

    routes = {
        f"/api/{pattern.pattern}" for pattern in urls.urlpatterns if pattern.name != "not-found"
    } - JOB_ROUTES
    placeholders = {
        "{event}": "<int:pk>",
        "{delivery}": "<int:pk>",
        "{side_effect}": "<int:pk>",
        "{recap}": "<uuid:pk>",
    }
    tabled = set()
    for spec in ENDPOINTS.values():
        path = spec[1].split("?")[0]
        for placeholder, converter in placeholders.items():
            path = path.replace(placeholder, converter)
        tabled.add(path)
    assert routes == tabled


# --- another site cannot drive it ----------------------------------------------------------


@pytest.fixture
def operator_headers():
    return {"HTTP_AUTHORIZATION": f"Token {token_for(make_user('operator'))}"}


@pytest.mark.parametrize(
    "endpoint", [name for name, spec in ENDPOINTS.items() if spec[0] == "post"]
)
@pytest.mark.parametrize("encoding", ["form", "multipart"])
def test_writes_accept_only_json(endpoint, encoding, objects, operator_headers):
    path, body = ENDPOINTS[endpoint][1:3]
    filled = _fill(body, objects)
    if encoding == "form":
        # What an HTML form on any other site can post without a CORS preflight.
        response = APIClient().post(
            path,
            urlencode(filled, doseq=True),
            content_type="application/x-www-form-urlencoded",
            **operator_headers,
        )
    else:
        response = APIClient().post(path, filled, format="multipart", **operator_headers)
    assert response.status_code == 415, response.content
    assert "Unsupported media type" in response.json()["detail"]
    assert not OperatorAction.objects.exists()


@pytest.mark.parametrize(
    "headers",
    [
        {"HTTP_ORIGIN": "https://evil.example"},
        {"HTTP_ORIGIN": "null"},
        {"HTTP_ORIGIN": "http://testserver.evil.example"},
        {"HTTP_SEC_FETCH_SITE": "cross-site"},
        {"HTTP_SEC_FETCH_SITE": "same-site"},
        {"HTTP_ORIGIN": "http://testserver", "HTTP_SEC_FETCH_SITE": "cross-site"},
    ],
    ids=["evil-origin", "null-origin", "lookalike-origin", "cross-site", "same-site", "mixed"],
)
@pytest.mark.parametrize(
    "endpoint", [name for name, spec in ENDPOINTS.items() if spec[0] == "post"]
)
def test_cross_site_writes_are_refused(endpoint, headers, objects, operator_headers):
    response = call(endpoint, objects, {**operator_headers, **headers})
    assert response.status_code == 403, response.content
    assert response.json()["detail"] == (
        "Cross-site writes are refused: send the request from this site."
    )
    assert not OperatorAction.objects.exists()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"HTTP_ORIGIN": "http://testserver"},
        {"HTTP_SEC_FETCH_SITE": "same-origin"},
        {"HTTP_SEC_FETCH_SITE": "none"},
        {"HTTP_ORIGIN": "https://console.example.org"},
    ],
    ids=["script", "own-origin", "same-origin", "typed", "trusted-origin"],
)
def test_own_site_and_scripts_may_write(headers, objects, operator_headers, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.org"]
    response = call("replay", objects, {**operator_headers, **headers})
    assert response.status_code == 200, response.content


def test_cross_site_reads_are_not_writes(objects, operator_headers):
    # Another site may make a browser send a GET, but cannot read the answer (no CORS).
    headers = {**operator_headers, "HTTP_ORIGIN": "https://x.example"}
    response = call("raw_event_list", objects, headers)
    assert response.status_code == 200


def test_a_session_write_needs_the_csrf_token(objects):
    """The browser's way in: the admin session, and then Django's CSRF check applies."""
    make_user("operator")
    api = APIClient(enforce_csrf_checks=True)
    assert api.login(username="operator", password="pw-operator")
    response = call("replay", objects, {}, api=api)
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert not OperatorAction.objects.exists()
    token = api.get("/admin/").cookies["csrftoken"].value
    api.cookies["csrftoken"] = token
    response = call("replay", objects, {"HTTP_X_CSRFTOKEN": token}, api=api)
    assert response.status_code == 200, response.content


# --- tokens --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [b"Token \xff\xfe", b"Token", b"Token a b", "Token " + "é" * 10],
    ids=["not-utf8", "empty", "spaces", "non-ascii"],
)
def test_malformed_tokens_are_401_not_500(header, objects):
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    response = APIClient().get("/api/raw-events/", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401, response.content


def test_expired_token_and_inactive_user_are_401(objects):
    from datetime import timedelta

    user = make_user("operator")
    _, expired = AuthToken.objects.create(user, expiry=timedelta(seconds=-1))
    response = APIClient().get("/api/raw-events/", HTTP_AUTHORIZATION=f"Token {expired}")
    assert response.status_code == 401
    live = token_for(user)
    user.is_active = False
    user.save()
    response = APIClient().get("/api/raw-events/", HTTP_AUTHORIZATION=f"Token {live}")
    assert response.status_code == 401


# --- the buyer API (recaps/views/apis.py): the same doors, shut the same way ---------------

# name: (method, path with {free}/{unpaid}, JSON body)
BUYER_ENDPOINTS = {
    "purchase": ("post", "/recaps/", {"event_id": "{event}"}),
    "detail": ("get", "/recaps/{free}/", None),
    "checkout": ("post", "/recaps/{unpaid}/checkout/", {}),
    "redeem": ("post", "/recaps/{free}/redeem/", {}),
}
BUYER_IDENTITIES = (
    "anonymous",
    "bad_token",
    "basic_auth_of_buyer",
    "token_of_another_buyer",
    "token_of_buyer",
    "session_of_buyer",
    "session_of_buyer_without_csrf_token",
)
# What the buyer (token or session with its CSRF token) gets from each endpoint.
BUYER_SUCCESS = {"purchase": 201, "detail": 200, "checkout": 201, "redeem": 200}


def expected_buyer_status(endpoint: str, identity: str) -> int:
    method = BUYER_ENDPOINTS[endpoint][0]
    if identity in ("anonymous", "bad_token", "basic_auth_of_buyer"):
        return 401
    if identity == "token_of_another_buyer":
        # Buying is open to anyone signed in; someone else's recap is not.
        return 201 if endpoint == "purchase" else 403
    if identity == "session_of_buyer_without_csrf_token" and method == "post":
        return 403
    return BUYER_SUCCESS[endpoint]


BUYER_TABLE = [
    pytest.param(
        endpoint,
        identity,
        expected_buyer_status(endpoint, identity),
        id=f"buyer-{endpoint}-{identity}",
    )
    for endpoint in BUYER_ENDPOINTS
    for identity in BUYER_IDENTITIES
]


@pytest.fixture
def buyer_objects(fake_stripe):
    from tests.recaps.factories import EventFactory, RecapFactory, UserFactory

    buyer = UserFactory.create(username="buyer")
    return {
        "buyer": buyer,
        "event": EventFactory.create().pk,
        "free": str(RecapFactory.create(buyer=buyer, is_free=True).pk),
        "unpaid": str(RecapFactory.create(buyer=buyer).pk),
    }


def buyer_client(identity: str, buyer) -> tuple[APIClient, dict[str, Any]]:
    """A client (its cookies) and the headers `identity` sends."""
    from tests.recaps.factories import UserFactory

    api = APIClient(enforce_csrf_checks=True)
    if identity == "bad_token":
        return api, {"HTTP_AUTHORIZATION": "Token " + "0" * 64}
    if identity == "basic_auth_of_buyer":
        basic = base64.b64encode(b"buyer:pw-for-tests").decode()
        return api, {"HTTP_AUTHORIZATION": f"Basic {basic}"}
    if identity == "token_of_another_buyer":
        return api, {"HTTP_AUTHORIZATION": f"Token {token_for(UserFactory.create())}"}
    if identity == "token_of_buyer":
        return api, {"HTTP_AUTHORIZATION": f"Token {token_for(buyer)}"}
    if identity.startswith("session_of_buyer"):
        api.force_login(buyer)
        if identity == "session_of_buyer":
            # The token a page of ours would carry (the cookie Django sets for its forms).
            token = api.get("/admin/login/").cookies["csrftoken"].value
            api.cookies["csrftoken"] = token
            return api, {"HTTP_X_CSRFTOKEN": token}
    return api, {}


def buyer_call(endpoint: str, objects: dict, api: APIClient, headers: dict):
    method, path, body = BUYER_ENDPOINTS[endpoint]
    url = path.format(**objects)
    if method == "get":
        return api.get(url, **headers)
    return api.post(url, _fill(body, objects), format="json", **headers)


def buyer_rows_unchanged(objects) -> bool:
    from recaps.models import RecapStatus, RecapVideo

    return (
        RecapVideo.objects.count() == 2
        and RecapVideo.objects.get(pk=objects["free"]).status == RecapStatus.PENDING_PAYMENT
    )


@pytest.mark.parametrize(("endpoint", "identity", "status"), BUYER_TABLE)
def test_buyer_permission_table(endpoint, identity, status, buyer_objects, fake_stripe):
    api, headers = buyer_client(identity, buyer_objects["buyer"])
    response = buyer_call(endpoint, buyer_objects, api, headers)
    assert response.status_code == status, response.content
    # One error shape for every JSON API: an RFC 9457 problem (kernel/problems.py).
    expected = "application/problem+json" if status >= 400 else "application/json"
    assert response["Content-Type"] == expected
    if status == 401:
        # Never a Basic challenge, which a browser would prompt for and then cache.
        assert response["WWW-Authenticate"] == "Token"
    if status >= 400:
        assert buyer_rows_unchanged(buyer_objects) and fake_stripe.requests == []


# What a page on another site can make a browser send: a form POST, whose body may be empty.
CROSS_SITE_FORMS = {
    "empty-form": ("", "application/x-www-form-urlencoded"),
    "form": ("event_id=1", "application/x-www-form-urlencoded"),
    "text-plain": ('{"event_id": 1}', "text/plain"),
}
# Request META as the test client takes it (values Any: they are keyword arguments).
CROSS_SITE_LABELS: dict[str, dict[str, Any]] = {
    "evil-origin": {"HTTP_ORIGIN": "https://evil.example"},
    "cross-site": {"HTTP_ORIGIN": "https://evil.example", "HTTP_SEC_FETCH_SITE": "cross-site"},
    "no-labels": {},  # an old browser sends neither
}


@pytest.mark.parametrize("labels", CROSS_SITE_LABELS)
@pytest.mark.parametrize("form", CROSS_SITE_FORMS)
@pytest.mark.parametrize(
    "identity",
    ["basic_auth_of_buyer", "session_of_buyer_without_csrf_token", "session_of_buyer"],
)
@pytest.mark.parametrize("endpoint", BUYER_ENDPOINTS)
def test_cross_site_form_posts_to_the_buyer_api_are_refused(
    endpoint, identity, form, labels, buyer_objects, fake_stripe
):
    """The finding of issue 30: a form on another site, posted with the buyer's cached Basic
    credentials, redeemed the free recap (200). Now Basic authenticates no one (401), the
    session without the CSRF token is refused (403), and with it a labelled cross-site write
    is (403); unlabelled, the form's content type is refused (415)."""
    if identity == "session_of_buyer" and labels == "no-labels":
        # Our own page's token, no labels: nothing says it is cross-site but the content type.
        expected = {415}
    elif identity == "basic_auth_of_buyer":
        expected = {401}
    else:
        expected = {403}
    api, headers = buyer_client(identity, buyer_objects["buyer"])
    body, content_type = CROSS_SITE_FORMS[form]
    path = BUYER_ENDPOINTS[endpoint][1].format(**buyer_objects)
    response = api.post(
        path, body, content_type=content_type, **headers, **CROSS_SITE_LABELS[labels]
    )
    assert response.status_code in expected, response.content
    assert buyer_rows_unchanged(buyer_objects) and fake_stripe.requests == []


@pytest.mark.parametrize(
    "endpoint", [name for name, spec in BUYER_ENDPOINTS.items() if spec[2] is not None]
)
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("", "application/x-www-form-urlencoded"),
        ("event_id=1", "application/x-www-form-urlencoded"),
        ("", "multipart/form-data; boundary=x"),
        ("", ""),
        ('{"event_id": 1}', "text/plain"),
    ],
    ids=["empty-form", "form", "empty-multipart", "no-content-type", "text-plain"],
)
def test_buyer_writes_accept_only_json(endpoint, body, content_type, buyer_objects, fake_stripe):
    """Even /checkout/ and /redeem/, which take no fields: `{}` as JSON, or a 415."""
    api, headers = buyer_client("token_of_buyer", buyer_objects["buyer"])
    path = BUYER_ENDPOINTS[endpoint][1].format(**buyer_objects)
    response = api.generic("POST", path, body, content_type=content_type, **headers)
    assert response.status_code == 415, response.content
    assert buyer_rows_unchanged(buyer_objects) and fake_stripe.requests == []
    # And the same write as JSON goes through.
    response = buyer_call(endpoint, buyer_objects, api, headers)
    assert response.status_code == BUYER_SUCCESS[endpoint], response.content


def test_a_buyer_write_that_is_not_a_json_object_is_a_400(buyer_objects):
    api, headers = buyer_client("token_of_buyer", buyer_objects["buyer"])
    response = api.post(
        f"/recaps/{buyer_objects['free']}/redeem/", "[]", content_type="application/json", **headers
    )
    assert response.status_code == 400, response.content
    assert buyer_rows_unchanged(buyer_objects)

"""Handler errors may quote the payload: staff without the payload permission see the class.

A handler formats a value from the body into its exception (`recap id '<from the body>' not
found`), and the inbox stores it as the delivery's error. Without
`ingress.view_raw_payload` the delivery list, the delivery page (and its attempts), the raw
event page and the API detail show `ValueError: message hidden: …`; with it, the pages show
the whole message, each view recorded (tests/console/test_payload_audit.py), and the list,
which is not recorded, still its class only.
"""

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from console.presentation import ERROR_DETAIL_HIDDEN, error_for_viewer
from ingress.inbox import inbox_run_once
from ingress.models import Delivery
from tests.console.conftest import receive_github

pytestmark = pytest.mark.django_db

MARKER = "recap-from-the-body-5f1e"


@pytest.fixture
def failed_delivery(client, push_handler):
    push_handler.fail_with = ValueError(f"recap id {MARKER!r} not found")
    event = receive_github(client, {"ref": "refs/heads/main", "recap": MARKER}, delivery="e-1")
    inbox_run_once()
    delivery = Delivery.objects.get(raw_event=event)
    assert MARKER in delivery.last_error and delivery.history.get().error == delivery.last_error
    return delivery


def pages(client, api, delivery) -> dict[str, str]:
    return {
        "delivery list": client.get("/admin/ingress/delivery/").content.decode(),
        "delivery page": client.get(
            reverse("admin:ingress_delivery_change", args=[delivery.pk])
        ).content.decode(),
        "raw event page": client.get(
            reverse("admin:ingress_rawevent_change", args=[delivery.raw_event_id])
        ).content.decode(),
        "api detail": api.get(f"/api/raw-events/{delivery.raw_event_id}/").content.decode(),
    }


def test_without_the_payload_permission_errors_show_their_class_only(
    client, operator, failed_delivery
):
    client.force_login(operator)
    api = APIClient()
    api.force_authenticate(operator)
    for name, page in pages(client, api, failed_delivery).items():
        assert MARKER not in page, name
        assert "ValueError: message hidden" in page, name
    detail = api.get(f"/api/raw-events/{failed_delivery.raw_event_id}/").json()
    [delivery] = detail["deliveries"]
    assert delivery["last_error"] == f"ValueError: {ERROR_DETAIL_HIDDEN}"
    assert [a["error"] for a in delivery["history"]] == [f"ValueError: {ERROR_DETAIL_HIDDEN}"]


def test_with_the_payload_permission_the_whole_message(client, payload_operator, failed_delivery):
    client.force_login(payload_operator)
    api = APIClient()
    api.force_authenticate(payload_operator)
    shown = pages(client, api, failed_delivery)
    assert MARKER not in shown.pop("delivery list")
    for name, page in shown.items():
        assert MARKER in page, name
        assert "message hidden" not in page, name


@pytest.mark.parametrize(
    ("stored", "may_read_payload", "shown"),
    [
        ("ValueError: recap id 'x' not found", True, "ValueError: recap id 'x' not found"),
        ("ValueError: recap id 'x' not found", False, f"ValueError: {ERROR_DETAIL_HIDDEN}"),
        (
            "json.JSONDecodeError: Expecting value",
            False,
            f"json.JSONDecodeError: {ERROR_DETAIL_HIDDEN}",
        ),
        ("PermanentHandlerError: ", False, f"PermanentHandlerError: {ERROR_DETAIL_HIDDEN}"),
        # Text that does not start with a class name could be anything.
        ("recap 'x': not found", False, f"error: {ERROR_DETAIL_HIDDEN}"),
        ("no colon at all", False, f"error: {ERROR_DETAIL_HIDDEN}"),
        ("", False, ""),
    ],
)
def test_error_for_viewer(stored, may_read_payload, shown):
    assert error_for_viewer(stored, may_read_payload=may_read_payload) == shown

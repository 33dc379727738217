"""The landing page at `/`: where staff start, and nothing for anyone else."""

import pytest
from django.contrib.auth.models import Permission

from tests.recaps.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_everyone_else_gets_a_plain_page_that_names_nothing(client):
    response = client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "nothing to see here" in page and "/admin/login/?next=/" in page
    for hidden in ("/ops/", "/api/", "127.0.0.1:9", "render service", "process_inbox"):
        assert hidden not in page


def test_a_signed_in_non_staff_user_gets_the_plain_page_too(client):
    client.force_login(UserFactory.create())
    assert "nothing to see here" in client.get("/").content.decode()


def test_staff_see_what_runs_and_where_to_go(client):
    client.force_login(UserFactory.create(is_staff=True))
    response = client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    for link in (
        'href="/admin/"',
        'href="/admin/ingress/rawevent/"',
        'href="/api/raw-events/"',
        'href="/admin/recaps/event/"',
    ):
        assert link in page
    assert "process_inbox" in page and "dispatch_side_effects" in page
    assert "Waiting: 0 raw events" in page
    # The ops page needs its permission; without it, no link to it.
    assert 'href="/ops/"' not in page


def test_staff_with_the_ops_permission_get_the_ops_links(client):
    user = UserFactory.create(is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_ops"))
    client.force_login(user)
    page = client.get("/").content.decode()
    assert 'href="/ops/"' in page and 'href="/api/queues/"' in page

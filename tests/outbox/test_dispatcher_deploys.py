"""Issue 27 on real processes: only a verdict about one recap may end it — no deploy does.

The production shape: the Procfile's web server receives Stripe's webhooks and the render
service's callbacks, `process_inbox` runs the handlers, the long-running
`dispatch_side_effects` asks the render service (the project's fake, a real HTTP server on
127.0.0.1) and checks overdue renders. Time is compressed through settings (backoff and the
breaker's cool-down under a second, a render's status due 0.8 s after it was accepted);
every phase is driven by what the processes did (answers given, rows moved), never by the
clock.

- The deploy story: `/health` green throughout while `POST /renders` answers 404 (an
  ingress's default backend), then 409 (the Idempotency-Key draft's "still in flight"),
  then 307 (a maintenance redirect), and `GET /renders/<id>` answers 404 for the recaps
  already `rendering`; recaps paid before and during it. Before issue 27: every one of them
  `failed`. Now: 0 failed, 0 dead, every recap ready, one render per key.
- A service restarted without its memory: every `rendering` recap's render is unknown
  (404); each is asked for again under its key and becomes ready.
- A 422 is still the one verdict: the recap fails at once, visibly, with the reason.
- Callbacks for a render that is not the recap's current one, in both orders, through the
  web server and the inbox: ignored, and the console says so.
"""

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import requests

from fakes.renderer import FakeRenderer
from ingress.models import Delivery, DeliveryAttempt, RawEvent
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.recaps.factories import EventFactory, RecapFactory
from tests.support.processes import (
    Managed,
    app_env,
    free_port,
    settings_database_url,
    start_manage,
    start_procfile,
    wait_until,
)
from tests.support.signing import checkout_session_event, post_signed_stripe

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECRET = os.environ["RENDERER_WEBHOOK_SECRET"]
# A phase lasts until the service has given this many of its answers.
ANSWERS_PER_PHASE = 4


@dataclass
class Stack:
    fake: FakeRenderer
    web_port: int
    processes: list[Managed] = field(default_factory=list)

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def wait(self, condition: Callable[[], bool], what: str, saw: Callable[[], object]) -> None:
        wait_until(condition, what, saw, self.processes, timeout=90)

    def pay(self, recap: RecapVideo) -> None:
        """Stripe reports the payment, through the web server."""
        post_signed_stripe(self.web, checkout_session_event(str(recap.id)))

    def posts(self) -> int:
        return sum(self.fake.stats()["posts_by_key"].values())

    def answer_for_a_while(self, status: int) -> None:
        """The service answers `status` (health green) until it has done so a few times."""
        self.fake.configure(mode="answer", status=status)
        before = self.posts()
        self.wait(
            lambda: self.posts() >= before + ANSWERS_PER_PHASE,
            f"{ANSWERS_PER_PHASE} render requests answered {status}",
            lambda: {"posts": self.posts() - before, "rows": row_states()},
        )


def row_states() -> dict[str, int]:
    states: dict[str, int] = {}
    for status in RecapVideo.objects.values_list("status", flat=True):
        states[status] = states.get(status, 0) + 1
    return states


def recaps(n: int) -> list[RecapVideo]:
    event = EventFactory.create()
    return [RecapFactory.create(event=event) for _ in range(n)]


@pytest.fixture
def stack(tmp_path):
    with FakeRenderer(secret=SECRET, callbacks=True, complete_after=0.2) as fake:
        port = free_port()
        env = app_env(
            settings_database_url(),
            RENDER_SERVICE_URL=fake.url,
            RENDER_CALLBACK_URL=f"http://127.0.0.1:{port}/webhooks/renderer/",
            WEB_CONCURRENCY="1",
            INBOX_IDLE_SLEEP_SECONDS="0.05",
            DELIVERY_BACKOFF_BASE_SECONDS="0.2",
            DELIVERY_BACKOFF_CAP_SECONDS="0.5",
            OUTBOX_IDLE_SLEEP_SECONDS="0.1",
            OUTBOX_BACKOFF_BASE_SECONDS="0.2",
            OUTBOX_BACKOFF_CAP_SECONDS="0.5",
            OUTBOX_DISPATCH_BUDGET_SECONDS="10",
            OUTBOX_STALE_PROCESSING_SECONDS="30",
            RENDER_BREAKER_COOLDOWN_SECONDS="0.5",
            RENDER_HEALTH_TIMEOUT_SECONDS="1",
            RENDER_CONNECT_TIMEOUT_SECONDS="1",
            RENDER_READ_TIMEOUT_SECONDS="2",
            RENDER_TIMEOUT_SECONDS="2",
            RENDER_STATUS_CONNECT_TIMEOUT_SECONDS="0.5",
            RENDER_STATUS_READ_TIMEOUT_SECONDS="0.5",
            RENDER_STATUS_TIMEOUT_SECONDS="0.5",
            RENDER_EXPECTED_SECONDS="0.5",
            RENDER_CALLBACK_MARGIN_SECONDS="0.3",
            RENDER_CHECK_INTERVAL_SECONDS="1",
            RENDER_CHECK_BUDGET_SECONDS="3",
            LOG_LEVEL="WARNING",
        )
        result = Stack(fake=fake, web_port=port)
        result.processes = [
            start_procfile("web", env, port=port, log=tmp_path / "web.log"),
            start_manage(["process_inbox"], env, log=tmp_path / "inbox.log"),
            start_manage(["dispatch_side_effects"], env, log=tmp_path / "dispatcher.log"),
        ]
        try:
            result.processes[0].wait_listening(port, timeout=60)
            yield result
        finally:
            for process in result.processes:
                process.stop()


def assert_nothing_final(everyone: list[RecapVideo]) -> None:
    assert not RecapVideo.objects.filter(status=RecapStatus.FAILED).exists()
    assert not RecapSideEffect.objects.filter(status="dead").exists()
    assert not Delivery.objects.filter(status="dead").exists()
    assert RecapVideo.objects.filter(pk__in=[r.pk for r in everyone]).count() == len(everyone)


def test_a_render_service_deploy_fails_no_recap(stack):
    """Before issue 27: 16/16 failed, 16 side effects dead, 0 rendered."""
    fake = stack.fake
    # Renders take a while and announce nothing: the status checks are what finds them
    # done, so the recaps accepted before the deploy are `rendering` when it starts.
    fake.configure(callbacks=False, complete_after=3.0)
    rendering = recaps(4)
    for recap in rendering:
        stack.pay(recap)
    stack.wait(
        lambda: RecapVideo.objects.filter(status=RecapStatus.RENDERING).count() == 4,
        "the first four recaps rendering",
        row_states,
    )
    before = recaps(8)
    for recap in before:
        stack.pay(recap)
    # The deploy: /health stays green; /renders and /renders/<id> answer 404 first.
    stack.answer_for_a_while(404)
    stack.wait(
        lambda: RecapSideEffect.objects.filter(history__outcome="resent").distinct().count() == 4,
        "the rendering recaps' status checks answered 404 and their renders asked for again",
        lambda: {"rows": row_states(), "status_requests": fake.stats()["status_requests"]},
    )
    during = recaps(4)
    fake.configure(mode="answer", status=409)
    for recap in during:
        stack.pay(recap)
    stack.answer_for_a_while(409)
    stack.answer_for_a_while(307)
    assert fake.stats()["health_checks"] >= 1  # the probes asked, and heard green
    assert_nothing_final(rendering + before + during)

    fake.configure(mode="ok")
    everyone = rendering + before + during
    stack.wait(
        lambda: RecapVideo.objects.filter(status=RecapStatus.READY).count() == len(everyone),
        "every recap ready",
        row_states,
    )
    assert_nothing_final(everyone)
    # One render per key, one key per recap: the re-sent requests were answered with the
    # renders the service already had.
    keys = [render.idempotency_key for render in fake.accepted]
    assert len(keys) == len(set(keys)) == len(everyone)
    rows = RecapSideEffect.objects.all()
    assert {row.idempotency_key for row in rows} == set(keys)
    # Nothing was charged for the deploy: each row's one charged attempt is its render.
    assert set(rows.values_list("attempts", flat=True)) == {1}
    outcomes = set(rows.values_list("history__outcome", flat=True))
    assert {"service_unavailable", "resent", "done"} <= outcomes
    assert {"transient", "permanent", "dead"}.isdisjoint(outcomes)


def test_a_service_that_restarts_and_forgets_its_renders_fails_no_recap(stack):
    fake = stack.fake
    fake.configure(callbacks=False, complete_after=2.0)
    everyone = recaps(5)
    for recap in everyone:
        stack.pay(recap)
    stack.wait(
        lambda: RecapVideo.objects.filter(status=RecapStatus.RENDERING).count() == 5,
        "every recap rendering",
        row_states,
    )
    lost = set(RecapVideo.objects.values_list("render_id", flat=True))
    fake.restart()
    stack.wait(
        lambda: RecapVideo.objects.filter(status=RecapStatus.READY).count() == 5,
        "every recap ready",
        row_states,
    )
    assert_nothing_final(everyone)
    # Each render was unknown once (404 on its status check) and asked for again under
    # the same key: two renders per key, the second one the recap's.
    accepted = [(r.idempotency_key, r.render_id) for r in fake.accepted]
    keys = Counter(key for key, _ in accepted)
    assert len(keys) == 5 and set(keys.values()) == {2}
    assert set(RecapVideo.objects.values_list("render_id", flat=True)).isdisjoint(lost)
    assert RecapSideEffect.objects.filter(history__outcome="resent").distinct().count() == 5


def test_a_422_still_fails_the_recap_at_once_with_the_reason(stack):
    stack.fake.configure(mode="error_4xx")
    (recap,) = recaps(1)
    stack.pay(recap)
    stack.wait(
        lambda: RecapVideo.objects.get(pk=recap.pk).status == RecapStatus.FAILED,
        "the recap failed",
        row_states,
    )
    recap.refresh_from_db()
    row = RecapSideEffect.objects.get(recap=recap)
    assert recap.failure_reason == (
        "render request gave up after 1 attempt(s): http_422: The render service answered HTTP 422."
    )
    assert (row.status, row.attempts, row.last_error_class) == ("dead", 1, "http_422")
    assert list(row.history.values_list("outcome", flat=True)) == ["permanent"]
    assert stack.fake.posts_by_key[row.idempotency_key] == 1  # asked once, never again


# --- callbacks are matched to the render they answer, in both orders --------------------


def _callback(stack: Stack, outcome: str, *, recap: RecapVideo, render_id: str, key: str):
    """The render service's signed callback about (render_id, key), through the web server."""
    from fakes.renderer import FakeRender

    render = FakeRender(
        render_id=render_id,
        idempotency_key=key,
        recap_id=str(recap.id),
        callback_url="",
        photos=6,
        created_at=datetime.now(tz=UTC),
    )
    body, headers = stack.fake.signed_callback(render, outcome)
    answer = requests.post(
        f"{stack.web}/webhooks/renderer/", data=body, headers=headers, timeout=(2, 10)
    )
    assert answer.status_code == 202, answer.text
    return json.loads(body)["data"]


def _handled(stack: Stack, render_id: str, outcome: str) -> DeliveryAttempt:
    stack.wait(
        lambda: DeliveryAttempt.objects.filter(
            delivery__raw_event__in=RawEvent.objects.filter(
                source="renderer", delivery_id=f"msg_{render_id}_{outcome}"
            ),
            outcome="done",
        ).exists(),
        f"the {outcome} callback of {render_id} handled",
        row_states,
    )
    return DeliveryAttempt.objects.get(
        delivery__raw_event__delivery_id=f"msg_{render_id}_{outcome}", outcome="done"
    )


def _failed_then_retried(stack: Stack) -> tuple[RecapVideo, str]:
    """A recap whose render g0 the service accepted and then reported failed; an operator
    asked for a new render (g1), which the service is rendering."""
    from outbox.services import recap_retry_render

    stack.fake.configure(callbacks=False, complete_after=30.0)
    (recap,) = recaps(1)
    stack.pay(recap)
    stack.wait(
        lambda: RecapVideo.objects.get(pk=recap.pk).status == RecapStatus.RENDERING,
        "the recap rendering",
        row_states,
    )
    recap.refresh_from_db()
    g0 = RecapSideEffect.objects.get(recap=recap).idempotency_key
    old = recap.render_id
    _callback(stack, "failed", recap=recap, render_id=old, key=g0)
    stack.wait(
        lambda: RecapVideo.objects.get(pk=recap.pk).status == RecapStatus.FAILED,
        "the recap failed by its render's verdict",
        row_states,
    )
    recap_retry_render(recap=recap)
    stack.wait(
        lambda: RecapVideo.objects.get(pk=recap.pk).status == RecapStatus.RENDERING,
        "the new render accepted",
        row_states,
    )
    return recap, old


def _assert_stale_note(client, admin_user, attempt: DeliveryAttempt, render_id: str) -> None:
    assert attempt.note.startswith(f"stale callback for render {render_id} (completed)")
    client.force_login(admin_user)
    page = client.get(
        f"/admin/ingress/rawevent/{attempt.delivery.raw_event_id}/change/"
    ).content.decode()
    assert f"stale callback for render {render_id}" in page


def test_a_late_callback_of_the_old_render_before_the_new_one_is_ignored(stack, client, admin_user):
    recap, old = _failed_then_retried(stack)
    row = RecapSideEffect.objects.get(recap=recap)
    g0 = f"recap-{recap.id}-render-g0"
    _callback(stack, "completed", recap=recap, render_id=old, key=g0)
    attempt = _handled(stack, old, "completed")
    _assert_stale_note(client, admin_user, attempt, old)
    recap.refresh_from_db()
    row.refresh_from_db()
    # Before issue 27: ready with the old video, and the new render's row settled.
    assert recap.status == RecapStatus.RENDERING and recap.render_id != old
    assert recap.video_url == "" and row.key_generation == 1
    current = recap.render_id
    _callback(stack, "completed", recap=recap, render_id=current, key=row.idempotency_key)
    assert _handled(stack, current, "completed").note == ""
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY and recap.video_url.endswith(f"/{current}.mp4")
    assert len(stack.fake.accepted) == 2  # g0 and g1: at most one outstanding at a time


def test_a_late_callback_of_the_old_render_after_the_new_one_is_ignored(stack, client, admin_user):
    recap, old = _failed_then_retried(stack)
    row = RecapSideEffect.objects.get(recap=recap)
    recap.refresh_from_db()
    current = recap.render_id
    _callback(stack, "completed", recap=recap, render_id=current, key=row.idempotency_key)
    _handled(stack, current, "completed")
    _callback(stack, "completed", recap=recap, render_id=old, key=f"recap-{recap.id}-render-g0")
    _assert_stale_note(client, admin_user, _handled(stack, old, "completed"), old)
    recap.refresh_from_db()
    assert (recap.status, recap.render_id) == (RecapStatus.READY, current)
    assert recap.video_url.endswith(f"/{current}.mp4")

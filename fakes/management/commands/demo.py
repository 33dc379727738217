import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from fakes.demo import (
    FINAL,
    DemoUnavailable,
    demo_failing,
    demo_failing_wait,
    demo_hint,
    demo_preflight,
    demo_run,
    demo_wait,
)
from ingress.handlers import all_handlers
from ingress.selectors import handler_pauses_active
from ingress.sources import all_sources
from kernel.errors import EventDropError
from recaps.models import RecapStatus, RecapVideo


class Command(BaseCommand):
    help = (
        "Create a demo event with photos, a buyer, a free recap and a paid one, and drive both "
        "through the running app (free redemption; purchase through the fake Stripe, whose "
        "signed webhook reaches our ingress); waits until both are ready. Needs `make run`."
    )

    def add_arguments(self, parser):
        parser.add_argument("--photos", type=int, default=None, help="photos of the event")
        parser.add_argument(
            "--wait", type=float, default=60.0, help="seconds to wait for ready (0: do not wait)"
        )
        parser.add_argument(
            "--failing",
            action="store_true",
            help="instead: send GitHub webhooks that the demo's failing handler gives up on "
            "(fakes/failing.py), to see an incident on /ops/incidents/",
        )
        parser.add_argument(
            "--web-url",
            default=None,
            help="the running web server (default http://127.0.0.1:$PORT, PORT from .env)",
        )

    def handle(self, *args, photos, wait, web_url, failing, **options):
        web_url = (web_url or f"http://127.0.0.1:{os.environ.get('PORT') or 8000}").rstrip("/")
        if failing:
            return self.failing(web_url=web_url, wait=wait)
        photos = photos if photos is not None else max(6, settings.RECAP_MIN_PHOTOS)
        try:
            demo_preflight(web_url=web_url)
            run = demo_run(photos=photos)
        except (DemoUnavailable, EventDropError) as exc:
            raise CommandError(f"demo: {exc}") from exc

        write = self.stdout.write
        write(
            f"event #{run.event.pk} {run.event.title!r} with {photos} photos, buyer "
            f"{run.free_recap.buyer.get_username()!r}"
        )
        write(f"free recap {run.free_recap.id}: redeemed ({run.free_recap.status})")
        write(
            f"paid recap {run.paid_recap.id}: checkout {run.checkout_url} paid on the fake "
            f"Stripe; its webhook {run.payment_event_id} got HTTP {run.webhook_status} "
            "from our ingress"
        )
        recaps = {run.free_recap.id: "free", run.paid_recap.id: "paid"}
        if wait > 0:
            final = demo_wait(
                recap_ids=list(recaps),
                timeout_seconds=wait,
                on_change=lambda recap: write(f"  {recaps[recap.id]} recap: {recap.status}"),
            )
        else:
            final = {recap_id: RecapVideo.objects.get(pk=recap_id) for recap_id in recaps}

        write("where to look:")
        for recap_id, kind in recaps.items():
            path = reverse("admin:recaps_recapvideo_change", args=[recap_id])
            write(f"  {kind} recap   {web_url}{path}")
        write(f"  its event   {web_url}{reverse('admin:recaps_event_change', args=[run.event.pk])}")
        write(f"  webhooks    {web_url}{reverse('admin:ingress_rawevent_changelist')}")
        write(f"  outbox      {web_url}{reverse('admin:outbox_recapsideeffect_changelist')}")
        write(f"  ops page    {web_url}{reverse('ops')}")
        write("  (sign in as staff: .venv/bin/python manage.py createsuperuser)")

        if wait <= 0:
            return
        stuck = [r for r in final.values() if r.status not in FINAL]
        failed = [r for r in final.values() if r.status == RecapStatus.FAILED]
        for recap in final.values():
            if recap.status == RecapStatus.READY:
                write(f"{recaps[recap.id]} recap ready: {recap.video_url}")
        if stuck or failed:
            lines = [
                f"{recaps[r.id]} recap {r.id} is {r.status} after {wait:g} s: "
                f"{held_hint(r) or demo_hint(r)}"
                for r in stuck
            ]
            lines += [f"{recaps[r.id]} recap {r.id} failed: {r.failure_reason}" for r in failed]
            raise CommandError("demo: " + "; ".join(lines))

    def failing(self, *, web_url: str, wait: float) -> None:
        try:
            ids = demo_failing(web_url=web_url)
        except (DemoUnavailable, EventDropError) as exc:
            raise CommandError(f"demo: {exc}") from exc
        write = self.stdout.write
        write(f"{len(ids)} GitHub webhooks for the failing handler: raw events {ids}")
        if wait > 0:
            dead = demo_failing_wait(raw_event_ids=ids, timeout_seconds=wait)
            write(f"{dead} of {len(ids)} deliveries dead (given up at once: DemoFailure)")
        write(f"  incidents   {web_url}{reverse('console-incidents')}")
        dead_list = f"{reverse('admin:ingress_delivery_changelist')}?status__exact=dead"
        write(f"  deliveries  {web_url}{dead_list}")
        write("  re-arm them from the incident's page; they fail again, on purpose")


# The source the fake Stripe's payment webhook is posted to (FAKE_STRIPE_WEBHOOK_URL).
PAYMENT_SOURCE = "stripe"
HELD_HINT = (
    "the payment webhook was received, but its handling is held: {scopes} paused (not run, "
    "nothing charged); resume it on the console's pauses page (/ops/pauses/)"
)


def held_hint(recap: RecapVideo) -> str:
    """A recap waiting for its payment while an operator's pause holds the payment's
    handlers: the inbox worker is fine, the pause is why (else "" and the usual hint)."""
    if recap.status != RecapStatus.PENDING_PAYMENT:
        return ""
    source = all_sources().get(PAYMENT_SOURCE)
    provider = source.provider if source else PAYMENT_SOURCE
    handlers = {spec.name for spec in all_handlers() if spec.provider == provider}
    scopes = [
        pause.scope
        for pause in handler_pauses_active()
        if pause.source == PAYMENT_SOURCE or pause.handler in handlers
    ]
    return HELD_HINT.format(scopes=" and ".join(scopes)) if scopes else ""

"""GitHub: a hook's deliveries against the dedup index; GitHub redelivers what we lack.

GitHub never retries a failed delivery by itself, and keeps a hook's deliveries for 3 days
(`GET /repos/{owner}/{repo}/hooks/{hook_id}/deliveries`, or `/orgs/{org}/hooks/...`,
newest first, 100 per page, cursor pagination through the `Link` header). Every attempt is
listed with its own `id`; a redelivery keeps the `guid` — the X-GitHub-Delivery header, our
dedup key — so attempts are grouped by guid. A guid is known (dedup index), pending (stored,
not yet verified: not missing) or missing. For a missing guid we ask GitHub to redeliver its
newest attempt (`POST .../deliveries/{id}/attempts`): the redelivery arrives through the
normal ingress, signed with the hook's secret. Nothing is fabricated here.

- Missing is decided by our store, not by GitHub's status: a delivery GitHub lists as OK
  that we do not hold (a proxy answered for us) is redelivered; one it lists as failed that
  we hold anyway (we answered after GitHub's 10 s timeout) is not — that would only add a
  duplicate — and the run notes how many there were.
- A guid whose newest attempt is at or after the window's end is in flight (a redelivery
  asked for minutes ago, by this run or the last) and is left alone, so running twice in a
  row never asks twice.
- The token only ever goes to GITHUB_API_BASE (https, or loopback for tests): a `Link` to
  anywhere else is refused, and redirects are not followed.
"""

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.utils import timezone

from ingress.reconcile.config import reconcile_source, require_tls
from ingress.reconcile.errors import (
    AUTH_REFUSED,
    BAD_HOOK,
    FOREIGN_NEXT_LINK,
    NOT_CONFIGURED,
    PAGE_LIMIT,
    PERMISSION_DENIED,
    RATE_LIMITED,
    REQUEST_REFUSED,
    UNAVAILABLE,
    ReconcileFailed,
    ReconcileInvalid,
    ReconcileStopped,
)
from ingress.reconcile.runs import ReconcileOutcome, RunState, reconcile_run
from ingress.reconcile.selectors import pending_delivery_ids, provider_ids_classify
from ingress.reconcile.window import Window, iso, window_clamp
from ingress.sources import Source
from kernel.budgets import (
    BudgetClock,
    github_retry_policy,
    reconcile_budget_problem,
    reconcile_call_worst_case,
)

logger = logging.getLogger(__name__)

MAX_AGE = timedelta(days=3)
PAGE_SIZE = 100  # GitHub's maximum
API_VERSION = "2022-11-28"
# Per-delivery refusals (gone, too old) are noted and the run goes on; anything else stops it.
_REFUSED_ONE = {400, 404, 409, 422}
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")

REDELIVERY_REFUSED = "Redelivery of {guid} (delivery {delivery_id}) refused: {detail}"
FAILED_BUT_HERE = (
    "{count} delivery(ies) GitHub lists as failed reached us anyway (answered after GitHub "
    "gave up): not redelivered."
)


@dataclass(frozen=True)
class GitHubHook:
    owner: str  # "acme/app" for a repository hook, "acme" for an organization hook
    hook_id: int

    def __post_init__(self) -> None:
        parts = self.owner.split("/")
        valid = (
            len(parts) in (1, 2)
            and all(_NAME.fullmatch(part) and part not in {".", ".."} for part in parts)
            and self.hook_id > 0
        )
        if not valid:
            raise ReconcileInvalid(BAD_HOOK.format(spec=f"{self.owner}:{self.hook_id}"))

    @classmethod
    def parse(cls, spec: str) -> "GitHubHook":
        """`owner/repo:HOOK_ID` or `org:HOOK_ID` (RECONCILE_GITHUB_HOOKS entries)."""
        owner, _, hook_id = spec.strip().rpartition(":")
        if not hook_id.isdigit():
            raise ReconcileInvalid(BAD_HOOK.format(spec=spec))
        return cls(owner=owner, hook_id=int(hook_id))

    @property
    def is_repository(self) -> bool:
        return "/" in self.owner

    @property
    def path(self) -> str:
        kind = "repos" if self.is_repository else "orgs"
        return f"/{kind}/{self.owner}/hooks/{self.hook_id}"

    @property
    def scope(self) -> str:
        kind = "repo" if self.is_repository else "org"
        return f"{kind} {self.owner} hook {self.hook_id}"


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return message[:200] if isinstance(message, str) else ""


def _rate_limit_wait(response: requests.Response) -> str | None:
    """How long GitHub asks us to wait, "" if it does not say, None if not a rate limit.

    Primary limit: 403/429 with X-RateLimit-Remaining 0 (reset at X-RateLimit-Reset).
    Secondary limit: 403/429 with Retry-After, or a message naming the rate limit.
    """
    headers = response.headers
    if headers.get("retry-after"):
        return f", Retry-After {headers['retry-after'][:32]} s"
    if headers.get("x-ratelimit-remaining") == "0":
        reset = headers.get("x-ratelimit-reset", "")
        if reset.isdigit():
            return f", limit resets {iso(datetime.fromtimestamp(int(reset), tz=UTC))}"
        return ""
    if response.status_code == 429 or "rate limit" in _message(response).lower():
        return ""
    return None


class GitHubAPI:
    """The two calls a run makes, with explicit timeouts, bounded retries and the budget."""

    def __init__(self, *, clock: BudgetClock) -> None:
        if not settings.GITHUB_API_TOKEN:
            raise ReconcileFailed(
                NOT_CONFIGURED.format(setting="GITHUB_API_TOKEN", provider="GitHub")
            )
        self.base = settings.GITHUB_API_BASE.rstrip("/")
        require_tls(self.base, setting="GITHUB_API_BASE", purpose="send the GitHub token")
        self.clock = clock
        self.pages = 0
        self.timeout = (
            settings.GITHUB_CONNECT_TIMEOUT_SECONDS,
            settings.GITHUB_READ_TIMEOUT_SECONDS,
        )
        self.session = requests.Session()
        self.session.headers.update(
            {
                "Authorization": f"Bearer {settings.GITHUB_API_TOKEN}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": "eventdrop-reconcile",
            }
        )

    def close(self) -> None:
        self.session.close()

    def delivery_pages(self, hook: GitHubHook) -> Iterator[list[dict[str, Any]]]:
        url: str | None = f"{self.base}{hook.path}/deliveries?per_page={PAGE_SIZE}"
        while url:
            if self.pages >= settings.RECONCILE_MAX_PAGES:
                raise ReconcileStopped(PAGE_LIMIT.format(pages=self.pages))
            response = self._get(url)
            self._raise_for(response)
            try:
                page = response.json()
            except ValueError:
                page = None
            if not isinstance(page, list):
                raise ReconcileStopped(
                    UNAVAILABLE.format(
                        provider="GitHub", detail="the answer is not a JSON list", pages=self.pages
                    )
                )
            self.pages += 1
            yield [item for item in page if isinstance(item, dict)]
            url = self._next(response)

    def redeliver(self, hook: GitHubHook, delivery_id: int) -> str | None:
        """Ask GitHub to redeliver one delivery: None when accepted, else why not.

        Not retried: the endpoint is not idempotent (a retry after a lost answer would ask
        twice), and whatever is still missing is asked for again by the next run.
        """
        self.clock.require("github", reconcile_call_worst_case("github"))
        url = f"{self.base}{hook.path}/deliveries/{delivery_id}/attempts"
        try:
            response = self.session.post(url, timeout=self.timeout, allow_redirects=False)
        except requests.RequestException as exc:
            raise ReconcileStopped(
                UNAVAILABLE.format(provider="GitHub", detail=type(exc).__name__, pages=self.pages)
            ) from exc
        if response.status_code in _REFUSED_ONE:
            return f"HTTP {response.status_code} {_message(response)}".strip()
        self._raise_for(response)
        return None

    def _get(self, url: str) -> requests.Response:
        # The budget is checked once for the whole call: its worst case includes the retries.
        self.clock.require("github", reconcile_call_worst_case("github"))
        policy = github_retry_policy()
        attempt = 1
        while True:
            try:
                response = self.session.get(url, timeout=self.timeout, allow_redirects=False)
            except requests.RequestException as exc:
                failure = type(exc).__name__
            else:
                if response.status_code < 500:
                    return response
                failure = f"HTTP {response.status_code}"
            if policy.gives_up_after(attempt):
                raise ReconcileStopped(
                    UNAVAILABLE.format(provider="GitHub", detail=failure, pages=self.pages)
                )
            time.sleep(policy.delay(attempt))
            attempt += 1

    def _raise_for(self, response: requests.Response) -> None:
        status = response.status_code
        if 200 <= status < 300:
            return
        logger.warning("ingress.reconcile.github_error", extra={"status": status})
        if status == 401:
            raise ReconcileFailed(
                AUTH_REFUSED.format(provider="GitHub", status=status, setting="GITHUB_API_TOKEN")
            )
        wait = _rate_limit_wait(response) if status in (403, 429) else None
        if wait is not None:
            raise ReconcileStopped(
                RATE_LIMITED.format(provider="GitHub", status=status, wait=wait, pages=self.pages)
            )
        if status == 403:
            raise ReconcileFailed(
                PERMISSION_DENIED.format(
                    provider="GitHub",
                    status=status,
                    setting="GITHUB_API_TOKEN",
                    needed="to read and redeliver the hook's deliveries (webhooks: write)",
                )
            )
        if status >= 500:
            raise ReconcileStopped(
                UNAVAILABLE.format(provider="GitHub", detail=f"HTTP {status}", pages=self.pages)
            )
        detail = _message(response) or ("moved" if 300 <= status < 400 else "no message")
        raise ReconcileFailed(
            REQUEST_REFUSED.format(provider="GitHub", status=status, detail=detail)
        )

    def _next(self, response: requests.Response) -> str | None:
        url = response.links.get("next", {}).get("url")
        if not url:
            return None
        base, link = urlsplit(self.base), urlsplit(url)
        if (link.scheme, link.netloc) != (base.scheme, base.netloc) or not link.path.startswith(
            base.path
        ):
            raise ReconcileFailed(FOREIGN_NEXT_LINK.format(base=self.base))
        return url


@dataclass(frozen=True)
class _Attempt:
    delivery_id: int
    guid: str
    delivered_at: datetime
    raw: dict[str, Any]

    @classmethod
    def of(cls, delivery: dict[str, Any]) -> "_Attempt | None":
        guid, delivery_id = delivery.get("guid"), delivery.get("id")
        try:
            delivered_at = datetime.fromisoformat(str(delivery.get("delivered_at")))
        except ValueError:
            return None
        if not (isinstance(guid, str) and guid and type(delivery_id) is int):
            return None
        if delivered_at.tzinfo is None:
            return None
        return cls(delivery_id=delivery_id, guid=guid, delivered_at=delivered_at, raw=delivery)

    @property
    def succeeded(self) -> bool:
        code = self.raw.get("status_code")
        return isinstance(code, int) and 200 <= code < 300

    def describe(self) -> str:
        event = str(self.raw.get("event", "?"))
        if self.raw.get("action"):
            event += f".{self.raw['action']}"
        status = f"{self.raw.get('status', '?')} (HTTP {self.raw.get('status_code', '?')})"
        again = ", a redelivery" if self.raw.get("redelivery") else ""
        return (
            f"{self.guid} delivery {self.delivery_id} {event}: GitHub says {status} "
            f"at {iso(self.delivered_at)}{again}"
        )


def _compare_pages(
    state: RunState, *, api: GitHubAPI, source: Source, hook: GitHubHook, window: Window
) -> None:
    tally, seen, failed_but_here = state.tally, set(), 0
    for page in api.delivery_pages(hook):
        tally.pages += 1
        newest: dict[str, _Attempt] = {}
        past_window = False
        for attempt in filter(None, map(_Attempt.of, page)):
            # Newest first: the first attempt seen of a guid is its newest.
            if attempt.guid in seen:
                continue
            seen.add(attempt.guid)
            if attempt.delivered_at >= window.until:
                continue  # in flight
            if attempt.delivered_at < window.since:
                past_window = True
                continue
            newest[attempt.guid] = attempt
        classified = provider_ids_classify(
            source=source.name,
            provider_ids=list(newest),
            pending_among=lambda guids: pending_delivery_ids(
                source=source.name, delivery_ids=guids
            ),
        )
        tally.add(
            known=len(classified.known), pending=len(classified.pending), missing=classified.missing
        )
        failed_but_here += sum(not newest[guid].succeeded for guid in classified.known)
        for guid in classified.missing:
            attempt = newest[guid]
            state.list_missing(attempt.describe())
            if state.dry_run:
                continue
            refusal = api.redeliver(hook, attempt.delivery_id)
            if refusal is None:
                tally.redelivered_count += 1
            else:
                state.notes.append(
                    REDELIVERY_REFUSED.format(
                        guid=guid, delivery_id=attempt.delivery_id, detail=refusal
                    )
                )
        state.progress()
        if past_window:
            break
    if failed_but_here:
        state.notes.append(FAILED_BUT_HERE.format(count=failed_but_here))


@dataclass
class HookListing:
    """What one walk of a hook's deliveries, newest first, found of some GUIDs."""

    hook: GitHubHook
    listed: dict[str, _Attempt]  # the newest attempt of each GUID asked about that it lists
    oldest_seen: datetime | None = None  # the oldest `delivered_at` the walk reached
    ended: bool = False  # the walk read GitHub's last page: nothing older is kept
    stopped: str = ""  # why it stopped early (rate limit, page limit, budget, GitHub down)

    def covers(self, moment: datetime) -> bool:
        """Whether every delivery GitHub made from `moment` on was on the pages read."""
        if self.stopped:
            return False
        return self.ended or (self.oldest_seen is not None and self.oldest_seen < moment)


def github_hook_listing(
    api: GitHubAPI, hook: GitHubHook, *, guids: set[str], back_to: datetime
) -> HookListing:
    """Walk `hook`'s deliveries newest first until every GUID in `guids` is found or the walk
    reaches a delivery made before `back_to`. A walk stopped early (ReconcileStopped) keeps
    what it found and covers nothing; a failure to compare (ReconcileFailed) propagates."""
    listing = HookListing(hook=hook, listed={})
    try:
        for page in api.delivery_pages(hook):
            for attempt in filter(None, map(_Attempt.of, page)):
                if attempt.guid in guids and attempt.guid not in listing.listed:
                    listing.listed[attempt.guid] = attempt
                if listing.oldest_seen is None or attempt.delivered_at < listing.oldest_seen:
                    listing.oldest_seen = attempt.delivered_at
            reached = listing.oldest_seen is not None and listing.oldest_seen < back_to
            if reached or listing.listed.keys() >= guids:
                break
        else:
            listing.ended = True
    except ReconcileStopped as exc:
        listing.stopped = str(exc)
    return listing


def github_reconcile(
    *,
    hook: GitHubHook,
    since: datetime | None = None,
    until: datetime | None = None,
    dry_run: bool = False,
    source: str = "github",
    scheduled: bool = False,
) -> ReconcileOutcome:
    """Compare a hook's deliveries in the window with our store; ask for redeliveries."""
    window = window_clamp(
        provider="GitHub", max_age=MAX_AGE, now=timezone.now(), since=since, until=until
    )
    configured = reconcile_source(name=source, provider="github")

    def compare(state: RunState) -> None:
        if problem := reconcile_budget_problem(provider="github", scheduled=scheduled):
            raise ReconcileFailed(problem)
        clock = BudgetClock(
            settings.RECONCILE_RUN_BUDGET_SECONDS,
            setting="RECONCILE_RUN_BUDGET_SECONDS",
            exhausted=ReconcileStopped,
        )
        api = GitHubAPI(clock=clock)
        try:
            _compare_pages(state, api=api, source=configured, hook=hook, window=window)
        finally:
            api.close()

    return reconcile_run(
        provider="github",
        label="GitHub",
        source=configured.name,
        scope=hook.scope,
        window=window,
        dry_run=dry_run,
        compare=compare,
    )

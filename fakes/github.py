"""A fake of GitHub's webhooks: it sends signed deliveries and lists them as GitHub's REST API
does, a real HTTP server on 127.0.0.1 for the tests and `manage.py run_fake_github`.

    GET  /repos/{owner}/{repo}/hooks/{id}/deliveries   and  /orgs/{org}/hooks/{id}/...
         newest first, `page_size` per page, cursor pagination through a `Link` header
         (`per_page`, `cursor`), each delivery with `id`, `guid`, `delivered_at`,
         `redelivery`, `status_code`, `event`, `action`
    POST .../deliveries/{delivery_id}/attempts         202; a new attempt with the same GUID
         (`redelivery: true`): sent again to `webhook_url` when the fake sent the original
         (the same bytes, signed the same), else only listed, with the status
         `redelivery_status_code`
    POST /_fake/deliver   {"hook": "/repos/acme/app/hooks/7", "event": "member",
         "body": "<the JSON text>", "guid": optional}: what GitHub does when something
         happens — the body signed with `webhook_secret` (X-Hub-Signature-256) and POSTed to
         `webhook_url` under a new GUID (X-GitHub-Delivery), then listed with our answer's
         status. Answers {"id", "guid", "status_code"}.

Bearer auth against `token` on the API (not on /_fake/). Failure switches for the tests:
`forbidden` (403 without rate-limit headers), `rate_limited` ("primary": 403 +
X-RateLimit-Remaining 0; "secondary": 429 + Retry-After) from the `rate_limit_from_request`-th
request on, `server_errors` (that many 502s first), `next_link_base` (send the Link to another
origin), `refused_redeliveries` (delivery ids whose redelivery is answered 422, as GitHub does
for one too old).
"""

import hashlib
import hmac
import itertools
import json
import re
import threading
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from urllib.parse import SplitResult, parse_qsl, urlsplit

import requests

from fakes.local_service import LocalHTTPService

_LIST = re.compile(r"^(?P<hook>/(?:repos/[^/]+/[^/]+|orgs/[^/]+)/hooks/\d+)/deliveries$")
_ATTEMPT = re.compile(
    r"^(?P<hook>/(?:repos/[^/]+/[^/]+|orgs/[^/]+)/hooks/\d+)/deliveries/(?P<id>\d+)/attempts$"
)
_SEND_TIMEOUT = (2, 10)  # connect, read: GitHub gives up on an answer after 10 s


def github_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def github_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class FakeGitHub(LocalHTTPService):
    def __init__(
        self,
        *,
        token: str,
        page_size: int = 100,
        port: int = 0,
        webhook_url: str = "",
        webhook_secret: str = "",
    ):
        super().__init__(_Handler, port)
        self.token = token
        self.page_size = page_size
        self.webhook_url = webhook_url
        self.webhook_secret = webhook_secret
        self.deliveries: dict[str, list[dict]] = {}
        self.bodies: dict[str, bytes] = {}  # by GUID: what the fake sent
        self.requests: list[dict] = []
        self.redeliveries: list[tuple[str, int]] = []
        self.redelivery_status_code = 502
        self.forbidden = False
        self.rate_limited: str | None = None
        self.rate_limit_from_request = 1
        self.server_errors = 0
        self.next_link_base: str | None = None
        self.refused_redeliveries: set[int] = set()
        self.lock = threading.Lock()
        self._ids = itertools.count(1000)

    def add_delivery(
        self,
        hook: str,
        *,
        guid: str,
        delivered_at: datetime,
        status_code: int = 200,
        event: str = "push",
        action: str | None = None,
        redelivery: bool = False,
    ) -> dict:
        delivery = {
            "id": next(self._ids),
            "guid": guid,
            "delivered_at": github_time(delivered_at),
            "redelivery": redelivery,
            "duration": 0.27,
            "status": "OK" if 200 <= status_code < 300 else f"Invalid HTTP Response: {status_code}",
            "status_code": status_code,
            "event": event,
            "action": action,
            "installation_id": None,
            "repository_id": 42,
            "throttled_at": None,
        }
        with self.lock:
            self.deliveries.setdefault(hook, []).append(delivery)
        return delivery

    def listed(self, hook: str) -> list[dict]:
        with self.lock:
            return sorted(self.deliveries.get(hook, []), key=lambda d: d["id"], reverse=True)

    def list_requests(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "GET"]

    def send(self, hook: str, *, event: str, body: bytes, guid: str = "") -> dict:
        """Deliver `body` as GitHub does (signed, a new GUID unless given) and list it."""
        guid = guid or str(uuid.uuid4())
        status_code = self._post(event=event, body=body, guid=guid)
        with self.lock:
            self.bodies[guid] = body
        try:
            action = json.loads(body).get("action")
        except (ValueError, AttributeError):
            action = None
        return self.add_delivery(
            hook,
            guid=guid,
            delivered_at=datetime.now(tz=UTC),
            status_code=status_code,
            event=event,
            action=action if isinstance(action, str) else None,
        )

    def redeliver(self, hook: str, original: dict) -> None:
        body = self.bodies.get(original["guid"])
        status_code = self.redelivery_status_code
        if body is not None and self.webhook_url:
            status_code = self._post(event=original["event"], body=body, guid=original["guid"])
        self.add_delivery(
            hook,
            guid=original["guid"],
            delivered_at=datetime.now(tz=UTC),
            status_code=status_code,
            event=original["event"],
            action=original["action"],
            redelivery=True,
        )

    def _post(self, *, event: str, body: bytes, guid: str) -> int:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/fake",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": guid,
            "X-Hub-Signature-256": github_signature(self.webhook_secret, body),
        }
        try:
            response = requests.post(
                self.webhook_url, data=body, headers=headers, timeout=_SEND_TIMEOUT
            )
        except requests.RequestException:
            return 0  # GitHub lists a delivery it could not make with no status code
        return response.status_code


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return None

    @property
    def fake(self) -> FakeGitHub:
        return self.server.fake  # type: ignore[attr-defined]

    def _send(self, status: int, data: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _refused(self, count: int) -> bool:
        """Answer with the switched-on failure, if any; True when it did."""
        fake = self.fake
        if self.headers.get("Authorization") != f"Bearer {fake.token}":
            self._send(401, {"message": "Bad credentials"})
        elif fake.rate_limited and count >= fake.rate_limit_from_request:
            if fake.rate_limited == "primary":
                headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1893456000"}
                self._send(403, {"message": "API rate limit exceeded"}, headers)
            else:
                message = "You have exceeded a secondary rate limit."
                self._send(429, {"message": message}, {"Retry-After": "60"})
        elif fake.forbidden:
            self._send(403, {"message": "Resource not accessible by personal access token"})
        elif fake.server_errors > 0:
            fake.server_errors -= 1
            self._send(502, {"message": "Server Error"})
        else:
            return False
        return True

    def _record(self, url: SplitResult) -> int:
        fake = self.fake
        with fake.lock:
            fake.requests.append(
                {
                    "method": self.command,
                    "path": url.path,
                    "query": dict(parse_qsl(url.query)),
                    "authorization": self.headers.get("Authorization", ""),
                }
            )
            return len(fake.requests)

    def do_GET(self) -> None:
        fake = self.fake
        url = urlsplit(self.path)
        count = self._record(url)
        match = _LIST.match(url.path)
        if match is None:
            self._send(404, {"message": "Not Found"})
            return
        if self._refused(count):
            return
        listed = fake.listed(match["hook"])
        query = dict(parse_qsl(url.query))
        per_page = min(int(query.get("per_page", fake.page_size)), fake.page_size)
        offset = int(query.get("cursor", "v1_0").removeprefix("v1_"))
        page = listed[offset : offset + per_page]
        headers = {}
        if offset + per_page < len(listed):
            base = fake.next_link_base or fake.url
            cursor = f"v1_{offset + per_page}"
            link = f"{base}{match['hook']}/deliveries?per_page={per_page}&cursor={cursor}"
            headers["Link"] = f'<{link}>; rel="next"'
        self._send(200, page, headers)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/_fake/deliver":
            self._deliver()
            return
        fake = self.fake
        count = self._record(url)
        match = _ATTEMPT.match(url.path)
        if match is None:
            self._send(404, {"message": "Not Found"})
            return
        if self._refused(count):
            return
        hook, delivery_id = match["hook"], int(match["id"])
        original = next((d for d in fake.listed(hook) if d["id"] == delivery_id), None)
        if original is None:
            self._send(404, {"message": "Not Found"})
            return
        if delivery_id in fake.refused_redeliveries:
            self._send(422, {"message": "Delivery is too old to be redelivered"})
            return
        with fake.lock:
            fake.redeliveries.append((hook, delivery_id))
        fake.redeliver(hook, original)
        self._send(202, {})

    def _deliver(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            order = json.loads(self.rfile.read(length))
            hook, event, body = order["hook"], order["event"], order["body"].encode()
        except (ValueError, KeyError, TypeError, AttributeError):
            self._send(400, {"message": "expected {hook, event, body[, guid]}"})
            return
        if _LIST.match(f"{hook}/deliveries") is None:
            self._send(400, {"message": f"not a hook path: {hook!r}"})
            return
        delivery = self.fake.send(hook, event=event, body=body, guid=order.get("guid") or "")
        self._send(
            200,
            {
                "id": delivery["id"],
                "guid": delivery["guid"],
                "status_code": delivery["status_code"],
            },
        )

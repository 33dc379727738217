"""A local fake of the two GitHub hook-delivery endpoints a reconciliation run calls.

    GET  /repos/{owner}/{repo}/hooks/{id}/deliveries   and  /orgs/{org}/hooks/{id}/...
         newest first, `page_size` per page, cursor pagination through a `Link` header
    POST .../deliveries/{delivery_id}/attempts         202; records the redelivery and, like
         GitHub, lists a new attempt (same guid, `redelivery: true`) with the status
         `redelivery_status_code`

Bearer auth against `token`. Failure switches: `forbidden` (403 without rate-limit headers),
`rate_limited` ("primary": 403 + X-RateLimit-Remaining 0; "secondary": 429 + Retry-After)
from the `rate_limit_from_request`-th request on, `server_errors` (that many 502s first),
`next_link_base` (send the Link to another origin), `refused_redeliveries` (delivery ids
whose redelivery is answered 422, as GitHub does for one too old).
"""

import itertools
import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

_LIST = re.compile(r"^(?P<hook>/(?:repos/[^/]+/[^/]+|orgs/[^/]+)/hooks/\d+)/deliveries$")
_ATTEMPT = re.compile(
    r"^(?P<hook>/(?:repos/[^/]+/[^/]+|orgs/[^/]+)/hooks/\d+)/deliveries/(?P<id>\d+)/attempts$"
)


def github_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeGitHub:
    def __init__(self, *, token: str, page_size: int = 100):
        self.token = token
        self.page_size = page_size
        self.deliveries: dict[str, list[dict]] = {}
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
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeGitHub":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def add_delivery(
        self,
        hook: str,
        *,
        guid: str,
        delivered_at: datetime,
        status_code: int = 200,
        event: str = "push",
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
            "action": None,
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


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        return None

    def _send(self, status: int, data, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _refused(self, fake: FakeGitHub, count: int) -> bool:
        """Answer with the switched-on failure, if any; True when it did."""
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

    def _record(self, fake: FakeGitHub, url) -> int:
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
        fake: FakeGitHub = self.server.fake  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        count = self._record(fake, url)
        match = _LIST.match(url.path)
        if match is None:
            self._send(404, {"message": "Not Found"})
            return
        if self._refused(fake, count):
            return
        listed = fake.listed(match["hook"])
        offset = int(dict(parse_qsl(url.query)).get("cursor", "v1_0").removeprefix("v1_"))
        page = listed[offset : offset + fake.page_size]
        headers = {}
        if offset + fake.page_size < len(listed):
            base = fake.next_link_base or fake.url
            cursor = f"v1_{offset + fake.page_size}"
            link = f"{base}{match['hook']}/deliveries?per_page={fake.page_size}&cursor={cursor}"
            headers["Link"] = f'<{link}>; rel="next"'
        self._send(200, page, headers)

    def do_POST(self) -> None:
        fake: FakeGitHub = self.server.fake  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        count = self._record(fake, url)
        match = _ATTEMPT.match(url.path)
        if match is None:
            self._send(404, {"message": "Not Found"})
            return
        if self._refused(fake, count):
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
        fake.add_delivery(
            hook,
            guid=original["guid"],
            delivered_at=datetime.now(tz=UTC),
            status_code=fake.redelivery_status_code,
            event=original["event"],
            redelivery=True,
        )
        self._send(202, {})

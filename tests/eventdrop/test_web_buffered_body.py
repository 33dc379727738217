"""eventdrop.web.BufferedBody at the ASGI level: what reaches a responder, and what never does.

The real server runs it in tests/ingress/test_receive_framing.py and
tests/faults/test_slow_clients.py; here each branch is driven message by message.
"""

import asyncio
import json

from eventdrop.web import BufferedBody


class RecordingResponder:
    def __init__(self):
        self.calls: list[tuple[str, bytes]] = []

    async def respond(self, scope, body):
        self.calls.append((scope["path"], body))
        return 202, [], b"ok"


def run(messages: list[dict], *, headers=(), timeout=1.0, max_body_bytes=100, pause=0.0,
        path="/webhooks/stripe/"):
    """Feed `messages` to BufferedBody (then wait forever, like a client that stops);
    returns (the bodies the responders got, status sent, JSON body sent)."""
    webhooks, rest = RecordingResponder(), RecordingResponder()
    sent: list[dict] = []
    queue = list(messages)

    async def receive():
        if queue:
            if pause:
                await asyncio.sleep(pause)
            return queue.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path,
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    app = BufferedBody(webhooks=webhooks, rest=rest, timeout_seconds=timeout,
                       max_body_bytes=max_body_bytes, max_in_flight=4)
    asyncio.run(app(scope, receive, send))
    status = sent[0]["status"] if sent else None
    body = sent[1]["body"] if len(sent) > 1 else b""
    answer = json.loads(body) if sent and status != 202 else None
    return [call for responder in (webhooks, rest) for call in responder.calls], status, answer


def chunk(body: bytes, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_in_pieces_reaches_the_app_whole_and_once():
    calls, status, _ = run([chunk(b"ab", True), chunk(b"cd", True), chunk(b"", False)])
    assert calls == [("/webhooks/stripe/", b"abcd")] and status == 202


def test_webhooks_go_to_the_loop_and_everything_else_to_the_threads():
    webhooks, rest = RecordingResponder(), RecordingResponder()
    app = BufferedBody(webhooks=webhooks, rest=rest, timeout_seconds=1, max_body_bytes=100,
                       max_in_flight=4)
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    for path in ("/webhooks/github/", "/admin/", "/webhooks"):
        messages = [chunk(path.encode(), False)]

        async def receive(messages=messages):
            return messages.pop(0)

        asyncio.run(app({"type": "http", "path": path, "headers": []}, receive, send))
    assert webhooks.calls == [("/webhooks/github/", b"/webhooks/github/")]
    assert rest.calls == [("/admin/", b"/admin/"), ("/webhooks", b"/webhooks")]
    assert [message.get("status") for message in sent[::2]] == [202, 202, 202]


def test_lifespan_shutdown_runs_the_shutdown_hook():
    closed: list[bool] = []

    async def on_shutdown():
        closed.append(True)

    app = BufferedBody(webhooks=RecordingResponder(), rest=RecordingResponder(),
                       timeout_seconds=1, max_body_bytes=100, max_in_flight=4,
                       on_shutdown=on_shutdown)
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "lifespan"}, receive, send))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert closed == [True]


def test_a_body_that_does_not_arrive_in_time_is_408_and_never_reaches_the_app():
    calls, status, answer = run([chunk(b"a", True)], timeout=0.2)
    assert calls == [] and status == 408 and answer["error"] == "body_read_timeout"


def test_the_deadline_is_for_the_whole_body_not_per_read():
    pieces = [chunk(b"x", True) for _ in range(10)] + [chunk(b"", False)]
    calls, status, _ = run(pieces, timeout=0.3, pause=0.05)  # each read in time, all 0.5 s
    assert calls == [] and status == 408


def test_a_disconnect_before_the_end_of_a_declared_body_is_truncated_body():
    calls, status, answer = run(
        [chunk(b"y" * 10, True), {"type": "http.disconnect"}], headers=[("content-length", "50")]
    )
    assert calls == [] and status == 400 and answer["error"] == "truncated_body"
    assert "10 of the 50" in answer["message"]


def test_a_disconnect_in_a_chunked_body_is_malformed_body():
    calls, status, answer = run([{"type": "http.disconnect"}])
    assert calls == [] and status == 400 and answer["error"] == "malformed_body"


def test_a_declared_length_over_the_cap_is_413_before_any_read():
    calls, status, answer = run([], headers=[("content-length", "101")])
    assert calls == [] and status == 413 and answer["error"] == "body_too_large"


def test_a_streamed_body_over_the_cap_is_413_without_reading_on():
    calls, status, _ = run([chunk(b"x" * 60, True), chunk(b"x" * 60, True), chunk(b"", False)])
    assert calls == [] and status == 413


def test_past_the_cap_a_request_waits_unread_until_one_in_flight_is_answered():
    # What bounds the bodies held in memory: with a cap of 2, a third request's body is not
    # read (its receive() not called) while two are in flight, and is once one is answered.
    release = asyncio.Event()
    order: list[str] = []

    class SlowResponder:
        async def respond(self, scope, body):
            order.append(f"respond {body.decode()}")
            if body != b"3":
                await release.wait()
            return 202, [], b"ok"

    app = BufferedBody(webhooks=SlowResponder(), rest=SlowResponder(), timeout_seconds=1,
                       max_body_bytes=100, max_in_flight=2)

    async def request(number: str):
        async def receive():
            order.append(f"read {number}")
            return chunk(number.encode(), False)

        async def send(message):
            pass

        await app({"type": "http", "path": "/webhooks/stripe/", "headers": []}, receive, send)

    async def main():
        requests = [asyncio.create_task(request(n)) for n in ("1", "2", "3")]
        await asyncio.sleep(0.05)
        seen_while_full = list(order)
        release.set()
        await asyncio.gather(*requests)
        return seen_while_full

    seen_while_full = asyncio.run(main())
    assert seen_while_full == ["read 1", "respond 1", "read 2", "respond 2"]
    assert order[4:] == ["read 3", "respond 3"]

"""The production server's writes (eventdrop/web_protocol.py, _WritesJoinedPerTurn) on a real
uvloop transport: what is held for the loop turn is sent in order, sent before a close, and
dropped without an error when the client has already gone.

That an answer leaves in one TCP segment, and that a 100 Continue is not held back, is
checked through the real server in tests/ingress/test_receive_framing.py.
"""

import asyncio
import socket

import uvloop

from eventdrop.web_protocol import _WritesJoinedPerTurn


def _run(scenario):
    """Run `scenario(loop, joined, peer)` on uvloop with a connected socket pair; returns
    (its result, the exception contexts the loop reported)."""

    async def main():
        loop = asyncio.get_running_loop()
        reported: list[dict] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        ours, peer = socket.socketpair()
        peer.settimeout(2)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        try:
            result = await scenario(loop, _WritesJoinedPerTurn(transport, loop), peer)
            await asyncio.sleep(0.05)  # any callback still scheduled has run
            return result, reported
        finally:
            transport.close()
            peer.close()

    return uvloop.run(main())


def _read_until_closed(peer: socket.socket) -> bytes:
    received = b""
    while data := peer.recv(65536):
        received += data
    return received


def test_writes_of_one_turn_arrive_whole_and_in_order_after_it():
    async def scenario(loop, joined, peer):
        joined.write(b"HTTP/1.1 202 Accepted\r\n\r\n")
        joined.writelines([b"{", b"}"])
        peer.setblocking(False)
        try:
            before_the_turn_ends = peer.recv(65536)
        except BlockingIOError:
            before_the_turn_ends = b""
        peer.setblocking(True)
        await asyncio.sleep(0)  # the turn ends
        await asyncio.sleep(0.01)
        return before_the_turn_ends, peer.recv(65536)

    (held, sent), reported = _run(scenario)

    assert held == b""
    assert sent == b"HTTP/1.1 202 Accepted\r\n\r\n{}"
    assert reported == []


def test_close_sends_what_is_held_first():
    async def scenario(loop, joined, peer):
        joined.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n")
        joined.close()
        await asyncio.sleep(0.01)
        return await loop.run_in_executor(None, _read_until_closed, peer)

    received, reported = _run(scenario)

    assert received == b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n"
    assert reported == []


def test_what_is_held_for_a_client_that_has_gone_is_dropped_without_an_error():
    async def scenario(loop, joined, peer):
        joined.write(b"HTTP/1.1 202 Accepted\r\n\r\n")
        joined._transport.close()  # closed under it, as on a lost connection
        await asyncio.sleep(0.05)
        joined.write(b"late")  # a response finished after the client left
        await asyncio.sleep(0.05)
        return await loop.run_in_executor(None, _read_until_closed, peer)

    received, reported = _run(scenario)

    assert received == b""
    assert reported == []

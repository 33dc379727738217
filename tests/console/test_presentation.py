"""How bodies are shown: JSON pretty, text as is, anything else as a hex dump; never broken."""

import pytest

from console.presentation import (
    BODY_DISPLAY_CHARS,
    body_for_api,
    body_view,
    format_seconds,
    hex_dump,
)


@pytest.mark.parametrize(
    ("body", "kind", "text"),
    [
        (b"", "empty", ""),
        (b'{"a":1}', "json", '{\n  "a": 1\n}'),
        ('{"name":"Jötunheim"}'.encode(), "json", '{\n  "name": "Jötunheim"\n}'),
        (b"token=abc&team_id=T1", "text", "token=abc&team_id=T1"),
        (b"<b>bold</b>", "text", "<b>bold</b>"),  # escaping is the template's job
        (b"\xff\xfe", "binary", "00000000  ff fe" + " " * 42 + "  |..|"),
    ],
)
def test_body_view(body, kind, text):
    view = body_view(body)
    assert (view.kind, view.text, view.size, view.truncated) == (kind, text, len(body), False)


def test_large_bodies_are_truncated_for_display_only():
    view = body_view(b"x" * (BODY_DISPLAY_CHARS + 10))
    assert view.truncated and len(view.text) == BODY_DISPLAY_CHARS
    assert view.size == BODY_DISPLAY_CHARS + 10


def test_hex_dump_rows():
    assert hex_dump(b"ABCDEFGHIJKLMNOPQ").splitlines() == [
        "00000000  41 42 43 44 45 46 47 48 49 4a 4b 4c 4d 4e 4f 50  |ABCDEFGHIJKLMNOP|",
        "00000010  51" + " " * 45 + "  |Q|",
    ]


def test_api_bodies_are_exact():
    assert body_for_api(b"{}") == {"encoding": "utf-8", "data": "{}", "size": 2}
    assert body_for_api(b"\xff") == {"encoding": "base64", "data": "/w==", "size": 1}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "—"), (0.0123, "12 ms"), (4.25, "4.2 s"), (600, "10.0 min"), (7200, "2.0 h")],
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text

"""Helpers shared by the provider verifiers: one copy of each parsing and checking rule.

Every helper either returns what it was asked for or raises `Reject(reason)`. Each provider's
`verify` is wrapped in `returns_verdict`, which turns a `Reject` into a Verdict, so a
verifier reads as the provider's rules in order and still never raises for bad input.
"""

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from ingress.models import RejectionReason
from ingress.verifiers.base import Source, StoredRequest, Verdict

logger = logging.getLogger(__name__)

Key = TypeVar("Key")

# ASCII only: str.isdigit() and int() also accept other scripts' digits, "+", "_" and spaces,
# none of which a provider sends, and a signed timestamp must have one spelling.
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


class Reject(Exception):
    """Raised by a helper to end verification with `reason`; never leaves a verifier."""

    def __init__(self, reason: RejectionReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


def returns_verdict(
    verify: Callable[[Source, StoredRequest], Verdict],
) -> Callable[[Source, StoredRequest], Verdict]:
    @wraps(verify)
    def wrapper(source: Source, request: StoredRequest) -> Verdict:
        try:
            return verify(source, request)
        except Reject as rejection:
            return Verdict(reason=rejection.reason)

    return wrapper


# --- secrets -------------------------------------------------------------------------------


def usable_secrets(source: Source, decode: Callable[[str], Key]) -> list[tuple[int, Key]]:
    """(index, key) for every secret `decode` accepts, in rotation order.

    `decode` raises ValueError for a secret it cannot use. Such a secret is skipped and logged
    by index only: its value must never reach a log. Checked before the request itself, like
    the dispatcher's own no-secret check, so a configuration fault is reported as one.
    """
    keys: list[tuple[int, Key]] = []
    for index, secret in enumerate(source.secrets):
        try:
            keys.append((index, decode(secret)))
        except ValueError:
            logger.warning(
                "ingress.verify.unusable_secret",
                extra={"source": source.name, "secret_index": index},
            )
    if not keys:
        raise Reject(RejectionReason.NO_SECRET_CONFIGURED)
    return keys


def utf8_secret(secret: str) -> bytes:
    # A blank key is a configuration slip that anyone could sign with. Environment bytes that
    # are not UTF-8 arrive as lone surrogates and fail to encode here.
    if not secret.strip():
        raise ValueError("blank secret")
    return secret.encode("utf-8")


def match_hex_hmac(keys: list[tuple[int, bytes]], message: bytes, signatures: list[str]) -> int:
    """Index of the first secret whose HMAC-SHA256 hex digest equals one of `signatures`."""
    for index, key in keys:
        expected = hmac.new(key, message, hashlib.sha256).hexdigest()
        if any(hmac.compare_digest(expected, signature) for signature in signatures):
            return index
    raise Reject(RejectionReason.BAD_SIGNATURE)


# --- headers -------------------------------------------------------------------------------


def required_header(request: StoredRequest, name: str, reason: RejectionReason) -> str:
    value = request.headers.get(name)
    if not value:
        raise Reject(reason)
    return value


def signature_header(source: Source, request: StoredRequest) -> str:
    """The request's signature header: the source's, which is its provider's (ingress/providers.py)
    for every provider but `hmac`. The receive path stores nothing without it, but a row
    re-verified after a configuration change may lack it."""
    return required_header(request, source.signature_header, RejectionReason.MISSING_SIGNATURE)


def sha256_hex(digest: str) -> str:
    """A SHA-256 hex digest, lower-cased (some senders upper-case it)."""
    if not _SHA256_HEX.fullmatch(digest):
        raise Reject(RejectionReason.MALFORMED_HEADER)
    return digest.lower()


def scheme_hex_signature(value: str, scheme: str) -> str:
    """The digest of a `<scheme>=<hex>` header such as GitHub's `sha256=…` or Slack's `v0=…`."""
    found_scheme, separator, digest = value.partition("=")
    if not separator:
        raise Reject(RejectionReason.MALFORMED_HEADER)
    if found_scheme != scheme:
        raise Reject(RejectionReason.NO_MATCHING_SCHEME)
    return sha256_hex(digest)


# --- timestamps ----------------------------------------------------------------------------


def unix_timestamp(value: str) -> datetime:
    """An aware datetime from whole Unix seconds; anything else is a malformed header."""
    if not _UNIX_SECONDS.fullmatch(value):
        raise Reject(RejectionReason.MALFORMED_HEADER)
    try:
        return datetime.fromtimestamp(int(value), tz=UTC)
    except (OverflowError, OSError, ValueError) as exc:  # beyond datetime's range
        raise Reject(RejectionReason.MALFORMED_HEADER) from exc


def check_timestamp(signed_at: datetime, request: StoredRequest, tolerance_seconds: int) -> None:
    """Judge the signed timestamp against received_at, never now.

    A backlog, or a re-verification after a secret fix, then gives the answer the event would
    have had on arrival. Both directions count: a timestamp far ahead is as suspect as an old
    one (a sender's clock or a replay being prepared). Exactly at the tolerance still passes.
    """
    tolerance = timedelta(seconds=tolerance_seconds)
    if request.received_at - signed_at > tolerance:
        raise Reject(RejectionReason.STALE_TIMESTAMP)
    if signed_at - request.received_at > tolerance:
        raise Reject(RejectionReason.FUTURE_TIMESTAMP)


# --- bodies --------------------------------------------------------------------------------


def body_text(request: StoredRequest) -> str:
    try:
        return request.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Reject(RejectionReason.UNPARSEABLE_BODY) from exc


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    # ValueError covers JSONDecodeError and the int-digits limit; RecursionError deep nesting.
    except (ValueError, RecursionError) as exc:
        raise Reject(RejectionReason.UNPARSEABLE_BODY) from exc
    if not isinstance(value, dict):
        raise Reject(RejectionReason.UNPARSEABLE_BODY)
    return value


def is_form_encoded(request: StoredRequest) -> bool:
    content_type = request.headers.get("content-type", "")
    return content_type.split(";", 1)[0].strip().lower() == _FORM_CONTENT_TYPE


def form_fields(text: str) -> dict[str, str]:
    """An urlencoded body as a dict; a repeated field is ambiguous, so it is unparseable.

    Strict parsing keeps every body a verifier accepts parseable by the handlers' own
    ingress.payloads.parse_payload, which parses forms strictly too.
    """
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True, errors="strict")
    # Fields without "=", empty fields, percent-escapes that are not UTF-8.
    except ValueError as exc:
        raise Reject(RejectionReason.UNPARSEABLE_BODY) from exc
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise Reject(RejectionReason.UNPARSEABLE_BODY)
    return fields


def form_payload(fields: Mapping[str, str]) -> dict[str, Any]:
    """The JSON object a form body carries in its `payload` field (GitHub, Slack interactivity)."""
    payload = fields.get("payload")
    if payload is None:
        raise Reject(RejectionReason.UNPARSEABLE_BODY)
    return json_object(payload)


def json_only_body(request: StoredRequest, text: str) -> dict[str, Any]:
    """The body of a provider that only ever sends JSON.

    A form content type is refused: the handlers' ingress.payloads.parse_payload goes by the
    content type and would read the body as a form, so verifying it would only move the
    failure to every delivery. (A sender using `curl -d` without a content type hits this.)
    """
    if is_form_encoded(request):
        raise Reject(RejectionReason.UNPARSEABLE_BODY)
    return json_object(text)


def string_field(mapping: Mapping[str, Any], key: str) -> str:
    value = mapping.get(key)
    return value if isinstance(value, str) else ""

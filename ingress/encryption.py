"""Raw event bodies encrypted at rest (optional; off unless RAW_EVENT_ENCRYPTION_KEYS is set).

`cryptography`'s Fernet (AES-128-CBC with HMAC-SHA256, a random IV per message) through
MultiFernet for rotation: RAW_EVENT_ENCRYPTION_KEYS is a comma-separated list of Fernet keys,
the first encrypts, all decrypt. The word `plaintext` as the first entry stores new bodies
as received while the keys after it still decrypt (the way to turn encryption off: then
rotate_raw_event_keys writes every body back as plaintext). Encryption happens in Python
before the one INSERT of the receive path (ingress/services.py): that path stays one statement.

Each row says how its body is stored in `body_encryption`: "" for plaintext, else "fernet:"
and an 8-hex fingerprint of the key that encrypted it (a SHA-256 prefix, which says nothing
about the key). That is what lets the inbox leave rows whose key we no longer hold `pending`
(our configuration, not the row's fault — never charged, never rejected), and the rotation
command find the rows still under an old key without decrypting them.

The stored column holds the Fernet token's raw bytes (its base64 decoded: a quarter smaller);
`body_sha256` stays the hash of the plaintext, for dedup and forensics.

Headers are encrypted with the body, under the same key, into the same jsonb column as
{"_fernet": "<token>"} (`encrypt_request`). What is read anywhere goes through
ingress.payloads.raw_event_body / raw_event_headers: the inbox's verification and dedup,
handlers' payloads, reconciliation, the console.
"""

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from kernel.errors import EventDropError

FERNET_PREFIX = "fernet:"
PLAINTEXT = ""
# As the first entry of RAW_EVENT_ENCRYPTION_KEYS: new bodies in plaintext, the keys decrypt.
PLAINTEXT_MARKER = "plaintext"
# Encrypted headers live in the same jsonb column, as {ENCRYPTED_HEADERS: "<Fernet token>"}.
ENCRYPTED_HEADERS = "_fernet"

BODY_UNDECRYPTABLE = (
    "The body of raw event #{id} is encrypted ({scheme}) and cannot be decrypted with "
    "RAW_EVENT_ENCRYPTION_KEYS: {why}."
)
KEY_NOT_CONFIGURED = "that key is not among the configured keys"
CIPHERTEXT_INVALID = "the stored token does not verify (corrupt, or encrypted with another key)"


class RawEventKeyError(EventDropError):
    """RAW_EVENT_ENCRYPTION_KEYS holds something that is not a Fernet key."""


class BodyUndecryptable(EventDropError):
    """A stored body that the configured keys cannot decrypt."""

    def __init__(self, message: str, *, key_configured: bool):
        super().__init__(message)
        # False: our configuration lacks the key (deferred, not the row's fault). True: the
        # key is there and the token still fails, so the row itself is damaged.
        self.key_configured = key_configured


@dataclass(frozen=True)
class Keyring:
    fernet: MultiFernet | None
    primary_id: str  # body_encryption value new bodies get ("" when encryption is off)
    known_ids: frozenset[str]  # every body_encryption value we can read, "" included

    @property
    def encrypts(self) -> bool:
        """New bodies are stored encrypted."""
        return self.primary_id != PLAINTEXT

    @property
    def may_hold_encrypted(self) -> bool:
        """Keys are configured, so stored bodies may be encrypted (SQL cannot search them)."""
        return self.fernet is not None


def key_id(key: str) -> str:
    return FERNET_PREFIX + hashlib.sha256(key.encode("ascii")).hexdigest()[:8]


def parse_keys(keys: list[str] | tuple[str, ...]) -> Keyring:
    """The keyring for these keys; RawEventKeyError names the bad one by position only."""
    keys = list(keys)
    plaintext_first = bool(keys) and keys[0] == PLAINTEXT_MARKER
    if plaintext_first:
        keys = keys[1:]
    fernets, ids = [], []
    for position, key in enumerate(keys, start=1 + plaintext_first):
        try:
            fernets.append(Fernet(key))
        except (ValueError, TypeError, binascii.Error):
            raise RawEventKeyError(
                f"RAW_EVENT_ENCRYPTION_KEYS entry {position} is not a Fernet key (32 url-safe "
                f"base64-encoded bytes) nor, as the first entry, {PLAINTEXT_MARKER!r}."
            ) from None
        ids.append(key_id(key))
    if len(set(ids)) != len(ids):
        raise RawEventKeyError("RAW_EVENT_ENCRYPTION_KEYS lists the same key twice.")
    if not fernets:
        return Keyring(fernet=None, primary_id=PLAINTEXT, known_ids=frozenset({PLAINTEXT}))
    return Keyring(
        fernet=MultiFernet(fernets),
        primary_id=PLAINTEXT if plaintext_first else ids[0],
        known_ids=frozenset({PLAINTEXT, *ids}),
    )


@lru_cache(maxsize=4)
def _keyring_for(keys: tuple[str, ...]) -> Keyring:
    return parse_keys(keys)


def keyring() -> Keyring:
    """The configured keyring (cached per key list, so tests that change settings work)."""
    return _keyring_for(tuple(settings.RAW_EVENT_ENCRYPTION_KEYS))


def bodies_may_be_encrypted() -> bool:
    """Whether stored bodies may be encrypted: then no SQL can search their text."""
    return keyring().may_hold_encrypted


def encrypt_body(body: bytes, ring: Keyring | None = None) -> tuple[bytes, str]:
    """(what to store, its body_encryption value); the body itself when encryption is off."""
    ring = ring or keyring()
    if ring.fernet is None or not ring.encrypts:
        return body, PLAINTEXT
    return base64.urlsafe_b64decode(ring.fernet.encrypt(body)), ring.primary_id


def encrypt_request(body: bytes, headers: dict) -> tuple[bytes, dict, str]:
    """(body, headers, body_encryption) to store: both under the first key, or as they are."""
    ring = keyring()  # once: this runs on every webhook's receive path
    stored_body, scheme = encrypt_body(body, ring)
    if scheme == PLAINTEXT or ring.fernet is None:
        return body, headers, PLAINTEXT
    token = ring.fernet.encrypt(json.dumps(headers).encode("ascii"))
    return stored_body, {ENCRYPTED_HEADERS: token.decode("ascii")}, scheme


def decrypt_body(stored: bytes, scheme: str, *, raw_event_id: int | None = None) -> bytes:
    """The plaintext of a stored body; BodyUndecryptable (no payload in it) when we cannot."""
    if scheme == PLAINTEXT:
        return stored
    return _decrypt(base64.urlsafe_b64encode(stored), scheme, raw_event_id)


def decrypt_headers(stored: dict, scheme: str, *, raw_event_id: int | None = None) -> dict:
    """The headers as received (stored under the same key as the body, when encrypted)."""
    if scheme == PLAINTEXT or not (isinstance(stored, dict) and set(stored) == {ENCRYPTED_HEADERS}):
        return stored
    return json.loads(_decrypt(stored[ENCRYPTED_HEADERS].encode("ascii"), scheme, raw_event_id))


def _decrypt(token: bytes, scheme: str, raw_event_id: int | None) -> bytes:
    ring = keyring()
    if ring.fernet is None or scheme not in ring.known_ids:
        raise BodyUndecryptable(
            BODY_UNDECRYPTABLE.format(id=raw_event_id, scheme=scheme, why=KEY_NOT_CONFIGURED),
            key_configured=False,
        )
    try:
        return ring.fernet.decrypt(token)
    except InvalidToken:
        raise BodyUndecryptable(
            BODY_UNDECRYPTABLE.format(id=raw_event_id, scheme=scheme, why=CIPHERTEXT_INVALID),
            key_configured=True,
        ) from None


def reencrypt_request(body: bytes, headers: dict, scheme: str) -> tuple[bytes, dict, str]:
    """Body and headers as the first entry of the keys says (the rotation command's step)."""
    return encrypt_request(decrypt_body(body, scheme), decrypt_headers(headers, scheme))

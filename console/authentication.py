"""How scripts and browsers prove who they are to the console API.

Scripts send `Authorization: Token <token>`: a django-rest-knox token, stored only as a
SHA-512 digest, with an expiry, issued and revoked with `manage.py api_token`. A browser
uses its admin session, and then Django's CSRF check (Origin and token) applies to every
write. HTTP Basic is not accepted: a browser replays cached Basic credentials on any
cross-site request, which is how another site could drive the API.

The token scheme is listed first, so a request without valid credentials is answered 401
with `WWW-Authenticate: Token` (DRF takes the header from the first class).
"""

from knox.auth import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

BAD_CREDENTIALS = "Invalid token."


class ApiTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, token: bytes):
        # knox decodes the header as UTF-8 and would raise (a 500) on other bytes.
        try:
            token.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed(BAD_CREDENTIALS) from exc
        return super().authenticate_credentials(token)

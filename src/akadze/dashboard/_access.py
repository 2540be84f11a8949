"""Who may use the dashboard: optional basic auth, and the CSRF check of actions.

Basic auth compares the user and the password in constant time (both are always
compared, so the time does not tell which one was wrong). The CSRF token is a random
secret of the app instance: every page carries it, a POST must send it back (form
field ``csrf_token`` or header ``X-CSRF-Token``), and a page of another site cannot
read it (the browser's same-origin policy), so it cannot forge an action.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ConfigurationError

USER_ENV = "AKADZE_DASHBOARD_USER"
PASSWORD_ENV = "AKADZE_DASHBOARD_PASSWORD"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(user={self.user!r}, password='***')"

    def accepts(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials."""
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, colon, password = decoded.partition(":")
        if not colon:
            return False
        same_user = hmac.compare_digest(user.encode(), self.user.encode())
        same_password = hmac.compare_digest(password.encode(), self.password.encode())
        return same_user & same_password


def credentials_from_env(environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Basic-auth credentials from AKADZE_DASHBOARD_USER and AKADZE_DASHBOARD_PASSWORD;
    None when neither is set; ConfigurationError when only one is, or one is empty."""
    env = os.environ if environ is None else environ
    user, password = env.get(USER_ENV), env.get(PASSWORD_ENV)
    if user is None and password is None:
        return None
    if not user or not password:
        missing = USER_ENV if not user else PASSWORD_ENV
        raise ConfigurationError(
            f"basic auth needs both {USER_ENV} and {PASSWORD_ENV}; {missing} is unset or empty"
        )
    if ":" in user:
        raise ConfigurationError(f"{USER_ENV} must not contain ':' (basic auth splits on it)")
    return Credentials(user, password)


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


class BasicAuth:
    """ASGI middleware: every HTTP request must carry the credentials."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = Request(scope).headers.get("authorization")
            if not self.credentials.accepts(header):
                response = PlainTextResponse(
                    "akadze dashboard: authentication required\n", status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="akadze dashboard", charset="UTF-8"'},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Csrf:
    """The token of one app instance, and the check of a POST."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)

    def refusal(self, request: Request, form: Mapping[str, str]) -> str | None:
        """Why the POST is refused (None: it may go on)."""
        if request.headers.get("sec-fetch-site") == "cross-site":
            return "refused: the request came from another site"
        given = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD) or ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return "refused: missing or wrong CSRF token (reload the page and try again)"
        return None

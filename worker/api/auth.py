"""Who is asking: an admin token on the API, a signed-in browser on the console.

* The API (``/api/v1``) takes ``Authorization: Bearer <admin token>`` only (never the
  console's cookie, so no page of another site can make a browser call it). No token, or a
  revoked or unknown one: 401. A ``read_only`` token asking to change something: 403.
* The console signs in once with a token (``POST /login``) and keeps a session cookie
  (``SESSION_COOKIE``: HttpOnly, SameSite=Lax, ``Secure`` over HTTPS or behind an https
  ``MANA_AI_CONSOLE_URL``) holding a random id of which only a hash is stored. Every
  state-changing console request must carry the session's CSRF token (form field ``csrf`` or
  header ``X-CSRF-Token``) and come from this origin (``Origin``, else ``Referer``; or
  ``MANA_AI_CONSOLE_URL``'s): a request without them is refused (403) whatever its cookie.

Errors never tell whether a token exists, is revoked or belongs to someone else: they say
that the request is not signed in, or not allowed.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.requests import Request

from worker.errors import ManaAIError
from worker.queries.admin_tokens import AdminPrincipal, AdminTokenStore, csrf_token

__all__ = [
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "Forbidden",
    "Unauthorized",
    "bearer_principal",
    "check_csrf",
    "check_origin",
    "public_origin",
    "session_principal",
]

SESSION_COOKIE = "mana_session"
CSRF_HEADER = "X-CSRF-Token"


class Unauthorized(ManaAIError):
    """The request is not signed in (401 on the API; the sign-in page on the console)."""


class Forbidden(ManaAIError):
    """The request is signed in but may not do this (403): a read-only token asking to
    change something, a console form without its CSRF token or from another origin."""


async def bearer_principal(request: Request, tokens: AdminTokenStore) -> AdminPrincipal:
    """The principal of the request's ``Authorization: Bearer`` token.

    Raises:
        Unauthorized: no bearer token, or not a live one.
    """
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send an admin token as 'Authorization: Bearer <token>'")
    principal = await tokens.principal(token.strip())
    if principal is None:
        raise Unauthorized("this token is not valid (unknown or revoked)")
    return principal


async def session_principal(request: Request, tokens: AdminTokenStore) -> AdminPrincipal | None:
    """The principal of the request's session cookie, or ``None`` (no cookie, or a session
    that ended, expired, or whose token was revoked)."""
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id or len(session_id) > 200:
        return None
    return await tokens.session_principal(session_id)


def public_origin(request: Request) -> str | None:
    """The origin of ``MANA_AI_CONSOLE_URL`` (``https://mana.example.com``), the console's
    address as people reach it through a proxy; ``None`` when it is not set."""
    url = request.app.state.services.settings.api.console_url
    if not url:
        return None
    parts = urlsplit(str(url))
    return _origin(parts.scheme, parts.netloc)


_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def _origin(scheme: str, netloc: str) -> str:
    """An origin as browsers send it (RFC 6454): lower case, without the scheme's default
    port (``https://mana.example.com:443`` is ``https://mana.example.com``)."""
    scheme, netloc = scheme.lower(), netloc.lower()
    default = _DEFAULT_PORTS.get(scheme)
    if default is not None and netloc.endswith(default):
        netloc = netloc.removesuffix(default)
    return f"{scheme}://{netloc}"


def check_origin(request: Request) -> None:
    """The request comes from this server's own origin (``Origin``, else ``Referer``): the one
    it was addressed to, or ``MANA_AI_CONSOLE_URL``'s (behind a proxy that does not pass the
    scheme and host on, the browser's origin is the proxy's).

    Raises:
        Forbidden: it names another origin, or neither header is there.
    """
    own = {_origin(request.url.scheme, request.url.netloc), public_origin(request)}
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        referer = request.headers.get("referer")
        if referer is None:
            raise Forbidden("this request did not say where it comes from (no Origin)")
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    parts = urlsplit(origin)
    if _origin(parts.scheme, parts.netloc) not in own:
        raise Forbidden(
            "this request comes from another site (behind a proxy, set MANA_AI_CONSOLE_URL "
            "to the address people use)"
        )


async def check_csrf(request: Request) -> None:
    """A state-changing console request carries its session's CSRF token (header
    ``X-CSRF-Token`` or form field ``csrf``) and comes from this origin.

    Raises:
        Forbidden: it does not.
    """
    check_origin(request)
    session_id = request.cookies.get(SESSION_COOKIE, "")
    given = request.headers.get(CSRF_HEADER)
    if given is None:
        form = await request.form()
        value = form.get("csrf")
        given = value if isinstance(value, str) else None
    if not session_id or not given or not hmac.compare_digest(given, csrf_token(session_id)):
        raise Forbidden("this form is out of date (its CSRF token does not match); reload the page")

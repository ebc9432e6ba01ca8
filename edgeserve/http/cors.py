"""Cross-origin resource sharing: web pages of other origins calling the function from a browser.

Off unless origins are configured (`[cors] origins`, `EDGESERVE_CORS_ORIGINS`, `serve
--cors-origin`, which sets the variable): only then does `create_app` put `Cors` in front of
the app, so a server without origins runs no layer for it. With origins:

- a preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here, 204,
  before auth (browsers never send credentials with one) and without reaching a route, the
  request headers the page asks for allowed (a fetch wrapper's `traceparent` or `baggage`
  does no harm: the app reads what it reads); one from an origin not listed, or asking a
  method edgeserve does not take, gets a 403 saying which (the browser shows the page a CORS
  failure; the body is for its developer);
- every other request from a listed origin gets Access-Control-Allow-Origin (the origin and
  `Vary: Origin`, or `*`) and the headers a client must read exposed, whatever its status:
  without them a 401, 413 or 503 reached the page as an opaque CORS failure;
- a request from an origin not listed gets no CORS header, so the browser keeps its answer
  from the page (it still runs: CORS guards what a page may read, not who may call).

On AWS Lambda the app is the one owner too: the function URL is made without a `Cors` setting
(sam.py, the driver), since two Access-Control-Allow-Origin values fail in every browser.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgeserve.errors import ConfigError, Forbidden, echo_header
from edgeserve.http.errors import error_response
from edgeserve.manifest import CorsSection

ORIGINS_ENV = "EDGESERVE_CORS_ORIGINS"
METHODS = ("GET", "POST", "OPTIONS")
EXPOSED_HEADERS = ("Inference-Header-Content-Length", "Retry-After", "WWW-Authenticate")
"""The response headers a page must read: the JSON's length in a binary v2 answer, when to
come back after a 503, what a 401 wants (Content-Type and Content-Length are readable anyway)."""
_ASKED = b"access-control-request-"


@dataclass(frozen=True)
class CorsPolicy:
    """The origins allowed (`*`: any), and what browsers are told with every answer."""

    origins: frozenset[str]
    credentials: bool = False
    max_age_s: int = 600

    @property
    def any_origin(self) -> bool:
        return "*" in self.origins


def load_cors(section: CorsSection, environ: Mapping[str, str]) -> CorsPolicy | None:
    """The policy configured, or None for no CORS; `EDGESERVE_CORS_ORIGINS` (comma-separated;
    set but empty: none) replaces the manifest's origins, which the same rules check."""
    origins = section.origins
    if ORIGINS_ENV in environ:
        listed = tuple(part.strip() for part in environ[ORIGINS_ENV].split(",") if part.strip())
        try:
            section = CorsSection(**{**section.model_dump(), "origins": listed})
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            given = f"{ORIGINS_ENV}={environ[ORIGINS_ENV]!r}"
            raise ConfigError(
                f"{given} (from serve --cors-origin or the environment): {reason}"
            ) from None
        origins = section.origins
    if not origins:
        return None
    return CorsPolicy(frozenset(origins), section.credentials, section.max_age_s)


class Cors:
    """The ASGI layer answering preflights and adding the headers (the module says which)."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy
        credentials = [(b"access-control-allow-credentials", b"true")] if policy.credentials else []
        self._actual = [
            (b"access-control-expose-headers", ", ".join(EXPOSED_HEADERS).encode()),
            *credentials,
        ]
        self._preflight = [
            (b"access-control-allow-methods", ", ".join(METHODS).encode()),
            (b"access-control-max-age", str(policy.max_age_s).encode()),
            *credentials,
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        asked = _cors_headers(scope["headers"])
        origin = asked.get(b"origin")
        if origin is None:  # not a browser's cross-origin request
            await self.app(scope, receive, send)
        elif scope["method"] == "OPTIONS" and b"access-control-request-method" in asked:
            await self._answer_preflight(origin, asked, scope, receive, send)
        elif added := self.answer_headers(origin):
            await self.app(scope, receive, self._adding(added, send))
        else:
            await self.app(scope, receive, send)

    def answer_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        """The headers an answer to a (non-preflight) request from `origin` carries: none for
        an origin not allowed. The protocol layer's own errors (a 408, 431) add them too."""
        if not self._allows(origin):
            return []
        return [*self._allowed(origin), *self._actual]

    def _allows(self, origin: str) -> bool:
        return self.policy.any_origin or origin in self.policy.origins

    def _allowed(self, origin: str) -> list[tuple[bytes, bytes]]:
        if self.policy.any_origin:
            return [(b"access-control-allow-origin", b"*")]
        return [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]

    async def _answer_preflight(
        self, origin: str, asked: dict[bytes, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        refused = self._refusal(origin, asked)
        if refused is not None:
            await error_response(Forbidden(refused))(scope, receive, send)
            return
        headers = [*self._allowed(origin), *self._preflight]
        if wanted := asked.get(b"access-control-request-headers"):
            headers.append((b"access-control-allow-headers", wanted.encode("latin-1")))
        if asked.get(b"access-control-request-private-network") == "true":
            headers.append((b"access-control-allow-private-network", b"true"))  # a LAN device
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def _refusal(self, origin: str, asked: dict[bytes, str]) -> str | None:
        """Why a preflight is refused, or None."""
        if not self._allows(origin):
            return (
                f"CORS: origin {echo_header(origin)} may not call this function from a browser: "
                f"it is not among the function's origins. Hint: add it to [cors] origins in "
                f"function.toml, {ORIGINS_ENV} or `edgeserve serve --cors-origin`"
            )
        method = asked[b"access-control-request-method"]
        if method not in METHODS:
            served = ", ".join(METHODS)
            return f"CORS: method {echo_header(method)} is not served; this function takes {served}"
        return None

    @staticmethod
    def _adding(headers: list[tuple[bytes, bytes]], send: Send) -> Send:
        """`send`, adding `headers` to the response's start: every status, errors included."""

        async def adding(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *headers]}
            await send(message)

        return adding


def _cors_headers(headers: list[tuple[bytes, bytes]]) -> dict[bytes, str]:
    """Origin and the Access-Control-Request-* headers of a request, names in lower case."""
    found = {}
    for name, value in headers:
        if name == b"origin" or name.startswith(_ASKED):
            found[name] = value.decode("latin-1")
    return found

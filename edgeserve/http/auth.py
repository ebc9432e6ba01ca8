"""Optional authentication for a function's HTTP API: a bearer token or an API key.

The secret never sits in function.toml (it ships inside the bundle): it comes from
`EDGESERVE_AUTH_TOKEN` (several separated by commas, for rotation) or from the file named by
`EDGESERVE_AUTH_TOKEN_FILE` (one token per line). With neither, the API is open, unless the
manifest says `[auth] required = true`, which refuses to start without one. Clients send
`Authorization: Bearer <token>` or `X-API-Key: <token>`; tokens are compared in constant time.
The paths in `[auth] open_paths` (health and /metrics by default) stay open for probes.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgeserve.errors import ConfigError, Unauthorized
from edgeserve.manifest import AuthSection

TOKEN_ENV = "EDGESERVE_AUTH_TOKEN"  # noqa: S105 - the name of a variable, not a secret
TOKEN_FILE_ENV = "EDGESERVE_AUTH_TOKEN_FILE"  # noqa: S105 - likewise
MIN_TOKEN_CHARS = 16
HINT = "send `Authorization: Bearer <token>` or `X-API-Key: <token>`"


@dataclass(frozen=True)
class Credentials:
    """The tokens this server accepts, and the paths anyone may reach."""

    tokens: tuple[bytes, ...]
    open_paths: frozenset[str]

    def check(self, path: str, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Raise Unauthorized unless `path` is open or the request carries an accepted token."""
        if path in self.open_paths:
            return
        presented = _presented(headers)
        if presented is None:
            raise Unauthorized(f"this function needs credentials: {HINT}")
        accepted = False
        for token in self.tokens:  # every token compared: the time says nothing of which
            accepted |= hmac.compare_digest(token, presented)
        if not accepted:
            raise Unauthorized("the token was not accepted", invalid=True)


def load_credentials(section: AuthSection, environ: Mapping[str, str]) -> Credentials | None:
    """The credentials configured in the environment, or None when the API is open."""
    tokens = _tokens(environ)
    if not tokens:
        if section.required:
            raise ConfigError(
                f"[auth] required = true, but neither {TOKEN_ENV} nor {TOKEN_FILE_ENV} is set. "
                f"Hint: export {TOKEN_FILE_ENV}=/path/to/token (one token per line)"
            )
        return None
    short = [token for token in tokens if len(token) < MIN_TOKEN_CHARS]
    if short:
        raise ConfigError(f"auth tokens need at least {MIN_TOKEN_CHARS} characters")
    return Credentials(tuple(t.encode() for t in tokens), frozenset(section.open_paths))


def _tokens(environ: Mapping[str, str]) -> list[str]:
    """The tokens configured; a variable that is set but names none (an empty file, a secret
    that came out empty) is refused: the API would be open where its owner meant it closed."""
    if path := environ.get(TOKEN_FILE_ENV):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(f"{TOKEN_FILE_ENV}={path}: cannot read it ({reason})") from None
        tokens, source = [line.strip() for line in text.splitlines() if line.strip()], path
    elif TOKEN_ENV in environ:
        tokens = [part.strip() for part in environ[TOKEN_ENV].split(",") if part.strip()]
        source = f"{TOKEN_ENV}"
    else:
        return []
    if not tokens:
        raise ConfigError(
            f"{source} holds no token, so the API would be open. Hint: write the token into it "
            f"(one per line in a file), or unset {TOKEN_FILE_ENV} and {TOKEN_ENV} for no auth"
        )
    return tokens


def _presented(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
        elif lowered == b"x-api-key" and value.strip():
            return value.strip()
    return None

"""The server under test: a URL, or a function served for the bench's duration.

A source dir or a bundle is served as a subprocess (`python -m edgeserve serve PATH --port N`),
so the bench measures the same code path users run, and the server gets its own process.
The control plane (readiness, metadata, stats) uses httpx; the load never does.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from edgeserve.errors import ConfigError, EdgeserveError
from edgeserve.manifest import MANIFEST_NAME, load_manifest

READY_POLL_S = 0.1
STOP_WAIT_S = 15.0
LOG_TAIL_CHARS = 2000
SERVE = (sys.executable, "-m", "edgeserve", "serve")


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens, and the function's source folder when bench served it."""

    host: str
    port: int
    root: Path | None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


HOST_PORT = re.compile(r"(?P<host>\[[0-9a-fA-F:.]+\]|[\w.-]+):(?P<port>\d+)")
"""A server given without a scheme (`127.0.0.1:8080`, `[::1]:8080`), where no such path exists."""
FORMS = (
    "bench takes a function folder, a bundle, http://HOST:PORT or HOST:PORT (a host name or "
    "address this machine resolves, a port 1-65535)"
)


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


@contextlib.contextmanager
def serving(
    target: str, ready_timeout_s: float, headers: Mapping[str, str] | None = None
) -> Iterator[Endpoint]:
    """The endpoint of `target`, ready; a path is served until the block ends, a server
    (URL, HOST:PORT) waited for (`ready_timeout_s`) with `headers` on its requests."""
    if is_url(target) or not Path(target).exists():
        remote = _parse_url(target if is_url(target) else f"http://{_server_address(target)}")
        _wait_ready(remote, ready_timeout_s, headers)
        yield remote
        return
    root = Path(target)
    port = _free_port()
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [*SERVE, str(root), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            endpoint = Endpoint("127.0.0.1", port, root)
            _wait_ready(endpoint, ready_timeout_s, served=(process, log))
            yield endpoint
        finally:
            _stop(process)


def _server_address(target: str) -> str:
    """`target`, no path here, as HOST:PORT (as `edgeserve invoke` takes it); else an error
    saying why it is neither, and what bench takes. `fn:1`, a folder's name mistyped, was
    taken for a server and failed as one that did not answer."""
    match = HOST_PORT.fullmatch(target)
    why = "and not a URL"
    if match and not 1 <= int(match["port"]) <= 65535:
        why = f"and {match['port']} is not a TCP port"
    elif match and not _resolves(match["host"].strip("[]")):
        why = f"and no host named {match['host']!r} resolves here"
    elif match:
        return target
    raise ConfigError(f"bench target {target}: no such file or folder, {why}; {FORMS}")


def _resolves(host: str) -> bool:
    """Whether `host` is an address or a name this machine resolves (the load would connect
    to it next: the lookup adds nothing that connecting would not do)."""
    try:
        return bool(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):  # no such name; a label too long for IDNA
        return False


def _parse_url(target: str) -> Endpoint:
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(f"bench target {target}: expected http://HOST:PORT (no TLS in the bench)")
    return Endpoint(parts.hostname, parts.port or 80, None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(
    endpoint: Endpoint,
    limit: float,
    headers: Mapping[str, str] | None = None,
    served: tuple[subprocess.Popen[bytes], Any] | None = None,
) -> None:
    """Poll /v2/health/ready until 200 or `limit` seconds; `served`: the `edgeserve serve`
    bench started (its process and log), whose exit ends the wait with its output. A running
    server that could not be reached was reported as a model bench could not name."""
    deadline, said = time.monotonic() + limit, ""
    with httpx.Client(base_url=endpoint.url, timeout=1.0, headers=headers) as client:
        while True:
            if served is not None and served[0].poll() is not None:
                raise EdgeserveError(
                    f"`edgeserve serve` exited ({served[0].returncode}):\n{_tail(served[1])}"
                )
            try:
                answer = client.get("/v2/health/ready")
            except httpx.HTTPError as exc:
                said = f"{type(exc).__name__}: {exc}. Hint: is `edgeserve serve` running there?"
            else:
                if answer.status_code == 200:
                    return
                said = f"GET /v2/health/ready: {answer.status_code} {answer.text[:300]}"
            if time.monotonic() >= deadline:
                break
            time.sleep(READY_POLL_S)
    if served is not None:
        hint = "Hint: raise --ready-timeout"
        raise EdgeserveError(
            f"`edgeserve serve` not ready after {limit:.0f} s; {hint}\n{_tail(served[1])}"
        )
    raise EdgeserveError(
        f"bench: {endpoint.url} not ready after {limit:g} s ({said}); raise --ready-timeout "
        "to wait longer"
    )


def _tail(log: Any) -> str:
    log.seek(0)
    return str(log.read())[-LOG_TAIL_CHARS:]


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server drains), then kill if it does not exit in time."""
    process.terminate()
    try:
        process.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Control:
    """The control-plane calls a bench makes: model name, metadata, config, stats."""

    def __init__(self, endpoint: Endpoint, headers: Mapping[str, str] | None = None) -> None:
        self._client = httpx.AsyncClient(base_url=endpoint.url, timeout=10.0, headers=headers)
        self._root = endpoint.root

    async def close(self) -> None:
        await self._client.aclose()

    async def model_name(self, explicit: str | None) -> str:
        """--model, else the served function's manifest, else the server's repository index."""
        if explicit:
            return explicit
        if self._root is not None and (self._root / MANIFEST_NAME).exists():
            return load_manifest(self._root).function.name
        try:
            index = await self._json("POST", "/v2/repository/index")
        except EdgeserveError as exc:  # a 401 was "cannot tell which model"
            raise ConfigError(f"{exc.message}. Hint: pass --model NAME") from None
        with contextlib.suppress(KeyError, IndexError, TypeError):
            return str(index[0]["name"])
        raise ConfigError("bench: cannot tell which model to load; Hint: pass --model NAME")

    async def metadata(self, model: str) -> dict[str, Any]:
        return dict(await self._json("GET", f"/v2/models/{model}"))

    async def config(self, model: str) -> dict[str, Any]:
        """The model config, or {} where the server has none (batching then unknown: off)."""
        with contextlib.suppress(EdgeserveError):
            return dict(await self._json("GET", f"/v2/models/{model}/config"))
        return {}

    async def stats(self, model: str) -> dict[str, Any] | None:
        """Triton's statistics for `model`, or None where the server does not serve them."""
        with contextlib.suppress(EdgeserveError):
            return dict(await self._json("GET", f"/v2/models/{model}/stats"))
        return None

    async def _json(self, method: str, path: str) -> Any:
        try:
            response = await self._client.request(
                method, path, json={} if method == "POST" else None
            )
        except httpx.HTTPError as exc:
            raise EdgeserveError(f"bench: {method} {path} failed: {exc!r}") from None
        if response.status_code != 200:
            raise EdgeserveError(f"bench: {method} {path}: {response.status_code} {response.text}")
        return response.json()

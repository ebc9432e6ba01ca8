"""CORS, the way browsers meet it: `edgeserve serve` on 127.0.0.1 answering preflights and
actual requests from allowed and other origins (auth on, errors, `--workers 2`, CORS off), and
a real headless chromium whose page on one origin fetch()es the function on another."""

from __future__ import annotations

import asyncio
import functools
import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.dataplane import serving
from edgeserve.errors import ConfigError
from edgeserve.http import create_app
from edgeserve.manifest import parse_manifest
from edgeserve.runtime import Runtime
from tests.models import mlp_model, write_function
from tests.server import running

PAGE = "http://page.test:8000"
OTHER = "http://elsewhere.test"
TOKEN = "cors-token-0123456789"
CORS_MLP = f"""
[function]
name = "mlp"
[resources]
max_body_mb = 0.01
[cors]
origins = ["{PAGE}"]
max_age_s = 120
"""
PLAIN_MLP = '[function]\nname = "mlp"\n'
ROWS = {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16).tolist()}
EXPOSED = "Inference-Header-Content-Length, Retry-After, WWW-Authenticate"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _bundle(root: Path, manifest: str) -> Bundle:
    source = write_function(root / "src", mlp_model, manifest)
    return build(source, root / "mlp", backend="onnxruntime")


@pytest.fixture(scope="module")
def cors_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return _bundle(tmp_path_factory.mktemp("cors"), CORS_MLP)


@pytest.fixture(scope="module")
def plain_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return _bundle(tmp_path_factory.mktemp("plain"), PLAIN_MLP)


@pytest.fixture(scope="module")
def guarded(cors_bundle: Bundle) -> Iterator[str]:
    """[cors] origins from the manifest, and a token required on every route but health."""
    auth = {"headers": {"Authorization": f"Bearer {TOKEN}"}}
    env = {"EDGESERVE_AUTH_TOKEN": TOKEN}
    with running(cors_bundle.root, env=env, client=auth) as (url, _):
        yield url


def preflight(url: str, origin: str, method: str = "POST", headers: str = "") -> httpx.Response:
    asked = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers:
        asked["Access-Control-Request-Headers"] = headers
    return httpx.options(url, headers=asked, timeout=30)


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def test_a_preflight_from_an_allowed_origin_is_204_without_credentials(guarded: str) -> None:
    asked = "content-type,authorization,inference-header-content-length,x-api-key"
    answer = preflight(f"{guarded}/v2/models/mlp/infer", PAGE, headers=asked)
    assert answer.status_code == 204 and answer.content == b""
    assert cors_headers(answer) == {
        "access-control-allow-origin": PAGE,
        "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-allow-headers": asked,
        "access-control-max-age": "120",
    }
    assert answer.headers["vary"] == "Origin"


def test_a_preflight_asking_for_headers_the_app_does_not_read_is_allowed(guarded: str) -> None:
    """A fetch wrapper's tracing headers must not cost the page its answers."""
    answer = preflight(f"{guarded}/invoke", PAGE, headers="content-type, traceparent, baggage")
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-headers"] == "content-type, traceparent, baggage"


@pytest.mark.parametrize(
    ("origin", "method", "headers", "says"),
    [
        (OTHER, "POST", "", f"origin '{OTHER}' may not call this function from a browser"),
        (PAGE, "DELETE", "", "method 'DELETE' is not served; this function takes GET, POST"),
    ],
)
def test_a_preflight_refused_is_403_saying_why_with_no_cors_header(
    guarded: str, origin: str, method: str, headers: str, says: str
) -> None:
    answer = preflight(f"{guarded}/invoke", origin, method, headers)
    assert answer.status_code == 403
    assert says in answer.json()["error"]
    assert cors_headers(answer) == {}


def test_an_allowed_origins_invoke_carries_the_headers(guarded: str) -> None:
    sent = {"Origin": PAGE, "Authorization": f"Bearer {TOKEN}"}
    answer = httpx.post(f"{guarded}/invoke", json=ROWS, headers=sent, timeout=30)
    assert answer.status_code == 200 and len(answer.json()["y"]) == 2
    assert cors_headers(answer) == {
        "access-control-allow-origin": PAGE,
        "access-control-expose-headers": EXPOSED,
    }
    assert answer.headers["vary"] == "Origin"


def test_a_binary_v2_answer_exposes_its_json_length(guarded: str) -> None:
    x = np.ones((3, 16), dtype=np.float32)
    tensor = {"name": "x", "datatype": "FP32", "shape": [3, 16]}
    header = orjson.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    )
    sent = {
        "Origin": PAGE,
        "X-Api-Key": TOKEN,
        "Inference-Header-Content-Length": str(len(header)),
    }
    url = f"{guarded}/v2/models/mlp/infer"
    answer = httpx.post(url, content=header + x.tobytes(), headers=sent, timeout=30)
    assert answer.status_code == 200, answer.text
    length = int(answer.headers["inference-header-content-length"])
    assert orjson.loads(answer.content[:length])["outputs"][0]["datatype"] == "FP32"
    assert "Inference-Header-Content-Length" in answer.headers["access-control-expose-headers"]
    assert answer.headers["access-control-allow-origin"] == PAGE


@pytest.mark.parametrize(
    ("what", "status"),
    [("no token", 401), ("a body over max_body_mb", 413), ("bad input", 400), ("no route", 404)],
)
def test_error_answers_carry_the_headers_so_the_page_reads_them(
    guarded: str, what: str, status: int
) -> None:
    """Without them the page sees an opaque CORS failure instead of the 401 or the 413."""
    token = {} if what == "no token" else {"X-Api-Key": TOKEN}
    path = "/predict" if what == "no route" else "/invoke"
    body = {"x": [[0.0] * 16] * 200} if what.startswith("a body") else {"x": [[1, 2]]}
    answer = httpx.post(f"{guarded}{path}", json=body, headers={"Origin": PAGE, **token})
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]
    assert answer.headers["access-control-allow-origin"] == PAGE
    if status == 401:
        assert answer.headers["www-authenticate"] == 'Bearer realm="edgeserve"'


def _in_process(
    bundle: Bundle, env: dict[str, str], requests: list[httpx.Request], started: bool = True
) -> list[httpx.Response]:
    """`requests` sent to the app made with `env`, in this process (started: as its lifespan
    would), for the settings that need no server of their own."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        runtime = Runtime.load(bundle, backend="onnxruntime")
        app = create_app(runtime)

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with AsyncExitStack() as stack:
            if started:
                await stack.enter_async_context(serving(runtime, 1.0))
            client = httpx.AsyncClient(transport=transport, base_url="http://fn")
            await stack.enter_async_context(client)
            return [await client.send(request) for request in requests]

    return asyncio.run(send())


def test_a_503_before_the_body_is_read_carries_them_too(cors_bundle: Bundle) -> None:
    """Admission refuses a request before its body is read (here: the runtime not started):
    503 with Retry-After, which the page may read."""
    post = httpx.Request("POST", "http://fn/invoke", json=ROWS, headers={"Origin": PAGE})
    (answer,) = _in_process(cors_bundle, {}, [post], started=False)
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.headers["access-control-allow-origin"] == PAGE
    assert "Retry-After" in answer.headers["access-control-expose-headers"]


def test_any_origin_is_answered_with_a_star_and_no_vary(plain_bundle: Bundle) -> None:
    asked = {"Origin": OTHER, "Access-Control-Request-Method": "POST"}
    sent = [
        httpx.Request("OPTIONS", "http://fn/invoke", headers=asked),
        httpx.Request("POST", "http://fn/invoke", json=ROWS, headers={"Origin": OTHER}),
    ]
    answers = _in_process(plain_bundle, {"EDGESERVE_CORS_ORIGINS": "*"}, sent)
    assert [answer.status_code for answer in answers] == [204, 200]
    for answer in answers:
        assert answer.headers["access-control-allow-origin"] == "*"
        assert (
            "vary" not in answer.headers
            and "access-control-allow-credentials" not in answer.headers
        )


def test_credentials_and_a_private_network_preflight(cors_bundle: Bundle) -> None:
    """`credentials = true` (a client certificate, cookies) on the preflight and the answer; a
    public page's preflight to a device on the LAN (Chrome's Private Network Access) allowed."""
    asked = {
        "Origin": PAGE,
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Private-Network": "true",
    }
    sent = [
        httpx.Request("OPTIONS", "http://fn/v2/models/mlp", headers=asked),
        httpx.Request("GET", "http://fn/v2/models/mlp", headers={"Origin": PAGE}),
    ]
    manifest = cors_bundle.manifest.model_copy(
        update={"cors": cors_bundle.manifest.cors.model_copy(update={"credentials": True})}
    )
    with_credentials = replace(cors_bundle, manifest=manifest)
    preflight, answer = _in_process(with_credentials, {}, sent)
    assert (preflight.status_code, answer.status_code) == (204, 200)
    assert preflight.headers["access-control-allow-private-network"] == "true"
    for response in (preflight, answer):
        assert response.headers["access-control-allow-credentials"] == "true"
        assert response.headers["access-control-allow-origin"] == PAGE


def test_another_origin_is_answered_without_cors_headers(guarded: str) -> None:
    """The browser then keeps the answer from the page; a client that is no browser is served."""
    sent = {"Origin": OTHER, "X-Api-Key": TOKEN}
    answer = httpx.post(f"{guarded}/invoke", json=ROWS, headers=sent, timeout=30)
    assert answer.status_code == 200
    assert cors_headers(answer) == {} and "vary" not in answer.headers


def test_cors_off_leaves_responses_as_they_were(plain_bundle: Bundle) -> None:
    with running(plain_bundle.root) as (url, _):
        asked = preflight(f"{url}/invoke", PAGE, headers="content-type")
        answer = httpx.post(f"{url}/invoke", json=ROWS, headers={"Origin": PAGE}, timeout=30)
        metadata = httpx.get(f"{url}/v2/models/mlp", headers={"Origin": PAGE})
    assert (asked.status_code, asked.headers["allow"]) == (405, "POST")
    assert answer.status_code == 200 and metadata.status_code == 200
    for response in (asked, answer, metadata):
        assert cors_headers(response) == {} and "vary" not in response.headers


def test_bad_origins_are_refused_at_start_naming_where(
    plain_bundle: Bundle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="browsers leave the default port out"):
        parse_manifest(
            {"function": {"name": "f"}, "cors": {"origins": ["https://a.test:443"]}}, "f.toml"
        )
    with pytest.raises(ConfigError, match=r'credentials = true with origins = \["\*"\]'):
        parse_manifest(
            {"function": {"name": "f"}, "cors": {"origins": ["*"], "credentials": True}}, "f.toml"
        )
    monkeypatch.setenv("EDGESERVE_CORS_ORIGINS", "")  # serve sets it: unset again after
    args = ["serve", str(plain_bundle.root), "--port", "0", "--cors-origin", "https://a.test/"]
    assert main(args) == ConfigError.exit_code
    said = " ".join(capsys.readouterr().err.split())
    assert "EDGESERVE_CORS_ORIGINS='https://a.test/' (from serve --cors-origin or the " in said
    assert "'https://a.test/' is not an origin: expected scheme://host[:port]" in said


class _Page(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A static web server on its own origin: (its origin, the folder it serves)."""
    folder = tmp_path_factory.mktemp("page")
    handler = functools.partial(_Page, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
        server.shutdown()


SCRIPT = """<!doctype html><html><body><pre id="out">pending</pre><script>
fetch("{url}/invoke", {{method: "POST", headers: {{"Content-Type": "application/json"}},
  body: JSON.stringify({rows})}})
  .then(r => r.json().then(j => "status " + r.status + " y " + JSON.stringify(j.y)))
  .catch(e => "failed: " + e)
  .then(text => {{ document.getElementById("out").textContent = text; }});
</script></body></html>"""


def _browse(page: str, folder: Path, function_url: str) -> str:
    """What the page on `page` shows after fetch()ing the function at `function_url`."""
    (folder / "index.html").write_text(
        SCRIPT.format(url=function_url, rows=orjson.dumps(ROWS).decode())
    )
    command = [CHROMIUM or "chromium", "--headless=new", "--no-sandbox", "--disable-gpu"]
    command += ["--no-first-run", "--virtual-time-budget=10000", "--dump-dom"]
    done = subprocess.run(
        [*command, f"{page}/index.html"], capture_output=True, text=True, timeout=90, check=True
    )
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is missing (scripts/system-deps.sh)")
def test_a_page_on_another_origin_reads_the_answer_only_with_cors(
    page_server: tuple[str, Path], plain_bundle: Bundle
) -> None:
    """With `--workers 2` and `--cors-origin` (the page's origin) the page shows the answer;
    served without CORS, the browser refuses it to the page."""
    page, folder = page_server
    with running(plain_bundle.root, "--workers", "2", "--cors-origin", page) as (url, _):
        shown = _browse(page, folder, url)
        answers = [
            httpx.post(f"{url}/invoke", json=ROWS, headers={"Origin": page}) for _ in range(6)
        ]
    assert '<pre id="out">status 200 y [[' in shown, shown
    assert {a.headers["access-control-allow-origin"] for a in answers} == {page}
    with running(plain_bundle.root) as (url, _):
        refused = _browse(page, folder, url)
    assert '<pre id="out">failed: TypeError: Failed to fetch</pre>' in refused, refused

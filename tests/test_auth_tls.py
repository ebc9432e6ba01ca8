"""Optional bearer-token auth and TLS, through `edgeserve serve` on 127.0.0.1 with real clients
(httpx over real TLS with certificates made here, and tritonclient with its headers)."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.cli import main
from tests.models import mlp_model, write_function
from tests.server import running

TOKEN = "s3cret-token-0123456789"
OTHER = "rotated-token-9876543210"
ROWS = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("auth")
    source = write_function(root / "src", mlp_model, '[function]\nname = "mlp"\n')
    return build(source, root / "mlp", backend="onnxruntime")


def infer_body() -> dict[str, object]:
    tensor = {"name": "x", "shape": [2, 16], "datatype": "FP32", "data": ROWS.ravel().tolist()}
    return {"inputs": [tensor]}


def reference(bundle: Bundle) -> np.ndarray:
    return ort.InferenceSession(str(bundle.model_path)).run(None, {"x": ROWS})[0]


@pytest.fixture(scope="module")
def guarded(bundle: Bundle) -> Iterator[str]:
    with running(bundle.root, env={"EDGESERVE_AUTH_TOKEN": f"{TOKEN},{OTHER}"}) as (url, _):
        yield url


def test_without_credentials_the_api_answers_401_with_www_authenticate(guarded: str) -> None:
    for response in (
        httpx.post(f"{guarded}/v2/models/mlp/infer", json=infer_body()),
        httpx.get(f"{guarded}/v2/models/mlp"),
        httpx.post(f"{guarded}/invoke", json={"x": ROWS.tolist()}),
    ):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="edgeserve"'
        assert "needs credentials: send `Authorization: Bearer <token>`" in response.json()["error"]


def test_a_wrong_token_is_invalid_token(guarded: str) -> None:
    response = httpx.get(f"{guarded}/v2/models/mlp", headers={"Authorization": "Bearer nope"})

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="edgeserve", error="invalid_token"'
    assert response.json() == {"error": "the token was not accepted"}


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {TOKEN}"},
        {"authorization": f"bearer {OTHER}"},
        {"X-API-Key": TOKEN},
    ],
)
def test_every_configured_token_is_accepted_either_way(
    guarded: str, bundle: Bundle, headers: dict[str, str]
) -> None:
    response = httpx.post(f"{guarded}/v2/models/mlp/infer", json=infer_body(), headers=headers)

    assert response.status_code == 200
    output = response.json()["outputs"][0]
    np.testing.assert_allclose(np.reshape(output["data"], (2, 4)), reference(bundle), atol=1e-5)


def test_health_and_metrics_stay_open_for_probes(guarded: str) -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(f"{guarded}{path}").status_code == 200


def test_tritonclient_passes_the_token_in_its_headers(guarded: str, bundle: Bundle) -> None:
    client = triton.InferenceServerClient(guarded.removeprefix("http://"))
    tensor = triton.InferInput("x", [2, 16], "FP32")
    tensor.set_data_from_numpy(ROWS, binary_data=True)
    try:
        with pytest.raises(Exception, match="needs credentials"):
            client.infer("mlp", [tensor])
        result = client.infer("mlp", [tensor], headers={"Authorization": f"Bearer {TOKEN}"})
    finally:
        client.close()
    np.testing.assert_allclose(result.as_numpy("y"), reference(bundle), atol=1e-5)


def test_edgeserve_invoke_and_bench_send_the_token_given_with_header(
    guarded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They could not reach a function with auth on (no way to send a token), and bench
    blamed the model name for the 401: "cannot tell which model to load"."""
    body = [
        "--json",
        '{"x": [[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]]}',
    ]
    token = ["-H", f"Authorization: Bearer {TOKEN}"]
    assert main(["invoke", guarded, *body]) != 0
    assert "HTTP 401: this function needs credentials" in capsys.readouterr().err
    assert main(["invoke", guarded, *body, *token]) == 0
    assert '"y"' in capsys.readouterr().out
    short = ["--window-s", "0.3", "--max-windows", "3", "--plot", ""]
    assert main(["bench", guarded, *short]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "POST /v2/repository/index: 401" in said and "needs credentials" in said
    assert main(["bench", guarded, *short, *token]) == 0
    assert "mlp" in capsys.readouterr().out


def test_bench_of_a_server_not_there_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """It said "cannot tell which model to load; Hint: pass --model NAME" at once."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{taken.getsockname()[1]}"  # bound, not listening
        assert main(["bench", url, "--ready-timeout", "1", "--plot", ""]) != 0
    said = " ".join(capsys.readouterr().err.split())
    assert f"bench: {url} not ready after 1 s (ConnectError" in said
    assert "Hint: is `edgeserve serve` running there?" in said


def test_a_token_file_given_on_the_command_line_and_no_open_paths(
    tmp_path: Path, bundle: Bundle
) -> None:
    source = write_function(
        tmp_path / "src", mlp_model, '[function]\nname = "mlp"\n[auth]\nopen_paths = []\n'
    )
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n\n{OTHER}\n")
    auth = {"headers": {"Authorization": f"Bearer {OTHER}"}}
    with running(source, "--auth-token-file", str(tokens), client=auth) as (url, _):
        assert httpx.get(f"{url}/v2/health/ready").status_code == 401
        assert httpx.get(f"{url}/v2/health/ready", headers={"X-API-Key": TOKEN}).status_code == 200


def serve_fails(path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    command = [sys.executable, "-m", "edgeserve", "serve", str(path), "--port", "0", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_auth_required_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    source = write_function(
        tmp_path / "src", mlp_model, '[function]\nname = "mlp"\n[auth]\nrequired = true\n'
    )
    out = serve_fails(source, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})

    assert "required = true, but neither EDGESERVE_AUTH_TOKEN nor" in out
    assert "loaded mlp" not in out  # refused before the model loads


@pytest.mark.parametrize("where", ["empty file", "file of blank lines", "empty variable"])
def test_a_token_source_that_holds_no_token_is_refused(
    tmp_path: Path, bundle: Bundle, where: str
) -> None:
    """An empty token file (a secret mounted empty) once served with no auth at all."""
    token_file = tmp_path / "token"
    token_file.write_text("" if where == "empty file" else "\n  \n")
    args = () if where == "empty variable" else ("--auth-token-file", str(token_file))
    env = {"HOME": str(tmp_path), **({"EDGESERVE_AUTH_TOKEN": ""} if not args else {})}
    out = serve_fails(bundle.root, *args, env=env)

    assert "holds no token, so the API would be open" in out


def test_a_short_token_is_refused(tmp_path: Path, bundle: Bundle) -> None:
    out = serve_fails(bundle.root, env={"EDGESERVE_AUTH_TOKEN": "abc", "HOME": str(tmp_path)})

    assert "auth tokens need at least 16 characters" in out


class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = self._certificate("edgeserve test CA", self.ca_key, None, ca=True)
        self.ca_file = self._write("ca.pem", self.ca, None)
        self.server = self._issue("server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        self.client = self._issue("client", [])

    def mutual_tls_args(self) -> tuple[str, ...]:
        """serve's flags for the server certificate, requiring client certificates of the CA."""
        cert, key = self.server
        files = ("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
        return (*files, "--ssl-ca-certs", str(self.ca_file))

    def _issue(self, name: str, sans: list[x509.GeneralName]) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = self._certificate(name, key, sans, ca=False)
        return self._write(f"{name}.pem", certificate, None), self._write(f"{name}.key", None, key)

    def _certificate(
        self,
        name: str,
        key: ec.EllipticCurvePrivateKey,
        sans: list[x509.GeneralName] | None,
        *,
        ca: bool,
    ) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject if ca else self.ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(key if ca else self.ca_key, hashes.SHA256())

    def _write(
        self,
        name: str,
        certificate: x509.Certificate | None,
        key: ec.EllipticCurvePrivateKey | None,
    ) -> Path:
        path = self.folder / name
        if certificate is not None:
            path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        else:
            assert key is not None
            path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two fronts"])
def test_https_with_a_certificate_and_key(pki: Pki, bundle: Bundle, workers: str) -> None:
    """With two fronts, the handshake happens in the front the supervisor handed the
    connection to (workers/handoff.py); one that fails leaves the next ones served."""
    cert, key = pki.server
    tls = ("--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--workers", workers)
    verify = ssl.create_default_context(cafile=str(pki.ca_file))
    with running(bundle.root, *tls, client={"verify": verify}) as (url, _):
        assert url.startswith("https://")
        clients = [httpx.Client(verify=verify) for _ in range(4)]  # both fronts, when two
        try:
            for client in clients:
                response = client.post(f"{url}/v2/models/mlp/infer", json=infer_body())
                assert response.status_code == 200
            with pytest.raises(httpx.HTTPError):
                httpx.get(url.replace("https://", "http://") + "/v2/health/live", timeout=5)
            for client in clients:
                response = client.post(f"{url}/v2/models/mlp/infer", json=infer_body())
                assert response.status_code == 200
        finally:
            for client in clients:
                client.close()


def test_mutual_tls_needs_a_client_certificate_from_the_ca(pki: Pki, bundle: Bundle) -> None:
    tls = pki.mutual_tls_args()
    with_client = ssl.create_default_context(cafile=str(pki.ca_file))
    with_client.load_cert_chain(*map(str, pki.client))
    without = ssl.create_default_context(cafile=str(pki.ca_file))
    with running(bundle.root, *tls, client={"verify": with_client}) as (url, _):
        assert httpx.get(f"{url}/v2/health/live", verify=with_client).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/v2/health/live", verify=without, timeout=5)


def test_tls_files_that_do_not_fit_fail_before_the_model_loads(
    pki: Pki, bundle: Bundle, tmp_path: Path
) -> None:
    cert, _ = pki.server
    _, other_key = pki.client
    out = serve_fails(
        bundle.root, "--ssl-certfile", str(cert), "--ssl-keyfile", str(other_key),
        env={"HOME": str(tmp_path)},
    )  # fmt: skip
    assert f"TLS files {cert}, {other_key}" in out
    assert "TLS needs both --ssl-certfile and --ssl-keyfile" in serve_fails(
        bundle.root, "--ssl-certfile", str(cert), env={"HOME": str(tmp_path)}
    )

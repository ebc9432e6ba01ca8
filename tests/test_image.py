"""One real image, built by `edgeserve build --target knative` with podman on a local base
(tests/base_image.py), then run on 127.0.0.1: v2 numbers, readiness, SIGTERM drain; pushed
to a real local registry and pulled back by digest; its plain Kubernetes manifests run by
`podman kube play`, HTTP and gRPC (the function asks for it). The one slow build of the suite
(about a minute; the base is cached)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
import yaml

from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.image import find_tool, push_image
from edgeserve.kubernetes.driver import workload
from edgeserve.kubernetes.manifests import plain_kubernetes
from edgeserve.kubernetes.settings import KubernetesSettings
from edgeserve.manifest import ResourcesSection
from tests.base_image import ensure_base_image
from tests.containers import (
    container,
    free_port,
    podman_available,
    podman_config,
    registry,
    wait_http,
)
from tests.models import mlp_model, write_function

DRAIN_S = ResourcesSection().drain_timeout_s  # the default drain bound

FIXTURES = Path(__file__).parent / "fixtures"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(podman_available() is not None, reason=str(podman_available())),
]

FUNCTION = """
[function]
name = "mlp"
version = "2"
[batching]
max_batch_size = 16
max_queue_delay_ms = 5
[backend]
prefer = ["onnxruntime"]
[handler]
module = "handler"
[resources]
grpc_port = 8001
"""
# /invoke takes half a second in postprocess: requests are in flight when SIGTERM comes
SLOW_HANDLER = (
    "import time\n\ndef postprocess(items, ctx):\n    time.sleep(0.5)\n    return len(items)\n"
)


class Built:
    def __init__(self, source: Path, bundle: Bundle, reference: str, report: str) -> None:
        self.source, self.bundle, self.reference, self.report = source, bundle, reference, report


@pytest.fixture(scope="module")
def registry_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with registry(tmp_path_factory.mktemp("registry")) as host:
        yield host


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, registry_host: str) -> Iterator[Built]:
    root = tmp_path_factory.mktemp("image")
    saved = os.environ.get("CONTAINERS_CONF")
    os.environ["CONTAINERS_CONF"] = str(podman_config(root))
    base = ensure_base_image()
    source = write_function(root / "mlp", mlp_model, FUNCTION, SLOW_HANDLER)
    (source / "knative.toml").write_text(
        f'driver = "knative"\n[settings]\nregistry = "{registry_host}/edgeserve-test"\n'
        f'base_image = "{base}"\nregistry_tls_verify = false\nprotocol = "grpc"\n'
    )  # the function serves gRPC too: Knative's one port carries it, HTTP stays in the pod
    out = root / "build" / "mlp"
    report = root / "build" / "dist" / "mlp-knative" / "image.txt"
    assert main(["build", str(source), "--out", str(out), "--target", "knative"]) == 0
    bundle = Bundle.open(out)
    reference = f"{registry_host}/edgeserve-test/mlp:2-{bundle.content_hash[:12]}"
    try:
        yield Built(source, bundle, reference, report.read_text())
    finally:  # every name this module tagged for its registry (builds, deploy, Lambda)
        names = subprocess.run(
            ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        ours = [n for n in names if n.startswith(f"{registry_host}/edgeserve-test/")]
        subprocess.run(["podman", "rmi", "-f", *ours], capture_output=True, check=False)
        if saved is None:
            os.environ.pop("CONTAINERS_CONF", None)
        else:
            os.environ["CONTAINERS_CONF"] = saved


def infer(url: str, x: np.ndarray) -> np.ndarray:
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        ]
    }
    reply = httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    out = reply.json()["outputs"][0]
    return np.array(out["data"], np.float32).reshape(out["shape"])


def test_build_reports_the_size_and_each_layer(built: Built) -> None:
    lines = built.report.splitlines()
    assert re.match(
        rf"image {re.escape(built.reference)}: \d+\.\d MB \(built with podman, "
        r"Python 3\.\d+ x86_64\)",
        lines[0],
    ), lines[0]
    steps = [line.split("MB", 1)[1].strip() for line in lines[1:]]
    copies = [step for step in steps if step.startswith("COPY")]
    assert [c.rsplit(" ", 1)[1] for c in copies] == [
        "/opt/edgeserve/packages",
        "/opt/edgeserve/app",
        "/opt/edgeserve/bundle",
    ]
    assert steps[-1].startswith('CMD ["python3", "-m", "edgeserve", "serve"')


def test_the_image_serves_v2_as_a_non_root_user(built: Built) -> None:
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    session = ort.InferenceSession(
        str(built.source / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    with container(built.reference) as (name, url, _):
        np.testing.assert_allclose(infer(url, x), session.run(None, {"x": x})[0], rtol=1e-5)
        whoami = ["podman", "exec", name, "python3", "-c", "import os; print(os.getuid())"]
        uid = subprocess.run(whoami, capture_output=True, text=True, check=True).stdout
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
    assert uid.strip() == "65532"


def readiness_flips_off(url: str, within_s: float) -> bool:
    """True once readiness stops answering 200 (podman kill returns before the signal lands)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code != 200:
                return True
        except httpx.HTTPError:
            return True
        time.sleep(0.02)
    return False


def test_sigterm_drains_the_requests_in_flight_within_the_grace_period(built: Built) -> None:
    replies: list[int] = []

    def call(url: str) -> None:
        reply = httpx.post(f"{url}/invoke", json={"x": [0.0] * 16}, timeout=30)
        replies.append(reply.status_code)

    with container(built.reference) as (name, url, _):
        callers = [threading.Thread(target=call, args=(url,)) for _ in range(4)]
        for caller in callers:
            caller.start()
        time.sleep(0.25)  # the requests are in the handler now
        stopped = time.monotonic()
        subprocess.run(
            ["podman", "kill", "--signal", "TERM", name], check=True, capture_output=True
        )
        assert readiness_flips_off(f"{url}/v2/health/ready", within_s=5)
        for caller in callers:
            caller.join(timeout=30)
        subprocess.run(["podman", "wait", name], check=True, capture_output=True, timeout=60)
        took = time.monotonic() - stopped
    assert replies == [200] * 4
    assert took < DRAIN_S  # inside the pod's grace period (drain + 5 s)


@pytest.fixture(scope="module")
def pulled(built: Built) -> Iterator[str]:
    """Pushed to the local registry, removed here, pulled back by digest: the digest ref."""
    tool = find_tool("podman")
    image_id = _image_id(built.reference)
    digest_ref = push_image(tool, built.reference, tls_verify=False)
    subprocess.run(["podman", "rmi", "-f", built.reference], check=True, capture_output=True)
    subprocess.run(
        ["podman", "pull", "--tls-verify=false", digest_ref], check=True, capture_output=True
    )
    assert _image_id(digest_ref) == image_id
    yield digest_ref
    subprocess.run(["podman", "rmi", "-f", digest_ref], capture_output=True, check=False)


def test_push_and_pull_back_by_digest(pulled: str, registry_host: str) -> None:
    assert re.fullmatch(
        rf"{re.escape(registry_host)}/edgeserve-test/mlp@sha256:[0-9a-f]{{64}}", pulled
    )
    tags = httpx.get(f"http://{registry_host}/v2/edgeserve-test/mlp/tags/list").json()["tags"]
    assert len(tags) == 1 and tags[0].startswith("2-")


def test_podman_kube_play_runs_the_plain_kubernetes_manifests(
    built: Built, pulled: str, tmp_path: Path
) -> None:
    from tests.containers import free_port

    docs = plain_kubernetes(workload(built.bundle, KubernetesSettings(min_scale=1), pulled))
    port, grpc_port = free_port(), free_port()
    # podman has no Service object: publish the container ports as a Service would expose them
    http, grpc = docs[0]["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert (grpc["name"], grpc["containerPort"]) == ("grpc", 8001)
    http.update(hostPort=port, hostIP="127.0.0.1")
    grpc.update(hostPort=grpc_port, hostIP="127.0.0.1")
    play = tmp_path / "kube.yaml"
    play.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    played = subprocess.run(
        ["podman", "kube", "play", str(play)],
        check=True,
        capture_output=True,
        timeout=120,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/v2/health/ready", 120)
        x = np.ones((2, 16), np.float32)
        assert infer(url, x).shape == (2, 4)
        with closing(triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")) as client:
            assert client.get_model_metadata("mlp").versions == ["2"]  # the image's --grpc-port
        # the pod requests one core and sets no limit: it plans for that core, not the host's
        container = played.stdout.split("Container:")[1].split()[0]
        logs = subprocess.run(
            ["podman", "logs", container], capture_output=True, text=True, timeout=30, check=True
        )
        assert "process layout: auto: 1 cores: one process" in logs.stdout + logs.stderr
    finally:
        subprocess.run(
            ["podman", "kube", "down", str(play)], capture_output=True, timeout=120, check=False
        )


def _image_id(reference: str) -> str:
    return subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", reference],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_deploy_pushes_by_digest_and_applies_to_a_stand_in_api_server(
    built: Built, registry_host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edgeserve deploy`: the real image build and push; the apply and the wait go to the
    STAND-IN API server (tests/kube_standin.py), as no cluster can run here."""
    from tests.kube_standin import stand_in_api_server

    with stand_in_api_server(tmp_path) as (kubeconfig, store):
        (built.source / "knative-deploy.toml").write_text(
            (built.source / "knative.toml")
            .read_text()
            .replace(
                "[settings]",
                "[settings]\n"
                f'kubeconfig = "{kubeconfig}"\nnamespace = "models"\nready_timeout_s = 10',
            )
        )
        capsys.readouterr()
        assert main(["deploy", str(built.source), "--target", "knative-deploy"]) == 0
        out = capsys.readouterr().out
        service = store.read(("serving.knative.dev/v1", "services", "models", "mlp"))
    assert "deployed mlp 2 to knative at http://mlp.models.example.com" in out
    assert service is not None
    image = service["spec"]["template"]["spec"]["containers"][0]["image"]
    repository, digest = image.split("@")
    assert repository == f"{registry_host}/edgeserve-test/mlp"
    manifest = httpx.get(
        f"http://{registry_host}/v2/edgeserve-test/mlp/manifests/{digest}",
        headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json"
        },
    )
    assert manifest.status_code == 200  # the digest the cluster would pull exists


INVOKE = """
import json, sys
import app  # Lambda's init phase: the model loads here, once
event = json.load(sys.stdin)
print(json.dumps(app.handler(event, None)))
"""


def test_lambda_package_type_image_builds_and_answers_a_function_url_event(
    built: Built, registry_host: str
) -> None:
    """`package_type = "image"` on a non-AWS base (the test base): awslambdaric is the entry
    point; here the handler is called in the container with a Function URL event, as the
    runtime interface client would call it (no Lambda Runtime API runs here)."""
    (built.source / "aws-lambda.toml").write_text(
        f'driver = "aws-lambda"\n[settings]\npackage_type = "image"\n'
        f'base_image = "{ensure_base_image()}"\n'
        f'image_repository = "{registry_host}/edgeserve-test/mlp-lambda"\n'
    )
    out = built.source.parent / "lambda-build"
    assert (
        main(["build", str(built.source), "--out", str(out / "mlp"), "--target", "aws-lambda"]) == 0
    )
    report = (out / "dist" / "mlp-aws-lambda" / "image.txt").read_text()
    reference = report.split()[1].rstrip(":")
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 10
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": x.ravel().tolist()}]
    }
    event = json.loads((FIXTURES / "aws_events" / "lambda-urls-request.json").read_text())
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/v2/models/mlp/infer"
    event.update(
        body=json.dumps(body), rawQueryString="", headers={"content-type": "application/json"}
    )
    event.pop("queryStringParameters", None)
    try:
        done = subprocess.run(
            [
                "podman",
                "run",
                "--rm",
                "-i",
                "--network",
                "none",
                "--entrypoint",
                "python3",
                reference,
                "-c",
                INVOKE,
            ],
            input=json.dumps(event),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        subprocess.run(["podman", "rmi", "-f", reference], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["statusCode"] == 200, answer
    outputs = json.loads(answer["body"])["outputs"][0]
    session = ort.InferenceSession(
        str(built.source / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(
        np.array(outputs["data"]).reshape(2, 4), session.run(None, {"x": x})[0], rtol=1e-5
    )
    assert 'ENTRYPOINT ["python3", "-m", "awslambdaric"]' in report


def test_a_base_image_that_cannot_be_pulled_says_to_set_base_image(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default base lives on gcr.io, out of reach from many build hosts: the error now
    says which setting takes a local image instead."""
    profile = tmp_path / "knative.toml"
    missing = f"127.0.0.1:{free_port()}/edgeserve-missing:1"
    profile.write_text(
        f'driver = "knative"\n[settings]\nregistry = "127.0.0.1:5000/x"\nbase_image = "{missing}"\n'
        'protocol = "http"\n'  # the function also serves gRPC: Knative routes one port
    )
    capsys.readouterr()
    code = main(
        ["build", str(built.source), "--out", str(tmp_path / "b"), "--target", str(profile)]
    )
    error = " ".join(capsys.readouterr().err.split())
    assert code != 0
    assert f"the base image {missing} is pulled unless podman has it" in error
    assert "set `base_image` in the target profile to a local image" in error

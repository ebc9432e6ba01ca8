"""The pure renderers: Knative and KServe manifests checked against the published CRD schemas
and Knative's admission rules; Deployment + Service + HPA; the concurrency formula."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.errors import ConfigError
from edgeserve.kubernetes.driver import KNATIVE, image_plan, image_requirements, workload
from edgeserve.kubernetes.manifests import inference_service, knative_service, plain_kubernetes
from edgeserve.kubernetes.manifests import render as render_kind
from edgeserve.kubernetes.scaling import Concurrency, derive_concurrency
from edgeserve.kubernetes.settings import KubernetesSettings
from edgeserve.manifest import BatchingSection, ResourcesSection
from edgeserve.profiles import load_target
from tests.kube_schemas import knative_admission_errors, schema_errors
from tests.models import mlp_model, write_function

DRAIN_S = ResourcesSection().drain_timeout_s  # the default drain bound

MANIFEST = """
[function]
name = "scorer"
version = "3"
[batching]
max_batch_size = 16
instances = 2
max_queue_size = 256
timeout_ms = 60000
[resources]
memory_mb = 1536
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("k8s")
    source = write_function(root / "src", mlp_model, MANIFEST)
    return build(source, root / "bundle", targets=("knative", "kserve", "kubernetes"))


IMAGE = "registry.example.com/team/scorer@sha256:" + "ab" * 32


def settings(**changes: object) -> KubernetesSettings:
    return KubernetesSettings(registry="registry.example.com/team", **changes)  # type: ignore[arg-type]


def test_knative_service_passes_the_schema_and_the_admission_rules(bundle: Bundle) -> None:
    service = knative_service(workload(bundle, settings(min_scale=0, max_scale=7), IMAGE))
    assert schema_errors("knative-service", service) == []
    template = service["spec"]["template"]
    assert knative_admission_errors(template["spec"]) == []
    assert template["metadata"]["name"].startswith("scorer-")
    notes = template["metadata"]["annotations"]
    assert notes["autoscaling.knative.dev/min-scale"] == "0"  # scale to zero
    assert notes["autoscaling.knative.dev/max-scale"] == "7"
    assert notes["autoscaling.knative.dev/metric"] == "concurrency"
    assert notes["autoscaling.knative.dev/target"] == "32"  # 2 instances x 16
    assert template["spec"]["containerConcurrency"] == 64
    container = template["spec"]["containers"][0]
    assert container["image"] == IMAGE
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["resources"]["limits"] == {"memory": "1536Mi"}
    # the pod's grace period (Knative: timeoutSeconds) covers the server's drain
    assert template["spec"]["timeoutSeconds"] >= max(60, DRAIN_S)


def test_kserve_inference_service_passes_the_schema(bundle: Bundle) -> None:
    isvc = inference_service(workload(bundle, settings(min_scale=1, max_scale=4), IMAGE))
    assert schema_errors("kserve-inferenceservice", isvc) == []
    assert isvc["metadata"]["name"] == bundle.name  # KServe routes /v2/models/{name} by host
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    predictor = isvc["spec"]["predictor"]
    assert [c["name"] for c in predictor["containers"]] == ["kserve-container"]
    assert knative_admission_errors(predictor) == []  # KServe creates a Knative Service of it
    expected = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "scaleMetric": "concurrency",
        "scaleTarget": 32,
        "containerConcurrency": 64,
    }
    assert {key: predictor[key] for key in expected} == expected


def test_the_checks_refuse_unknown_fields_and_knative_port_rules(bundle: Bundle) -> None:
    service = knative_service(workload(bundle, settings(), IMAGE))
    broken = copy.deepcopy(service)
    broken["spec"]["template"]["spec"]["replicas"] = 3
    broken["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = {}
    errors = schema_errors("knative-service", broken)
    assert any("'replicas' was unexpected" in e for e in errors), errors
    assert any("'lifecycle' was unexpected" in e for e in errors), errors
    pod = broken["spec"]["template"]["spec"]
    pod["containers"][0]["ports"] = [
        {"name": "web", "containerPort": 8012},
        {"containerPort": 8080},
    ]
    found = knative_admission_errors(pod)
    assert "exactly one container port is allowed, found 2" in found
    assert "8012 is a reserved port" in found
    assert any("'web' is not allowed" in e for e in found)


def test_knative_and_kserve_refuse_a_port_their_queue_proxy_holds_plain_kubernetes_takes_it(
    bundle: Bundle, grpc_bundle: Bundle
) -> None:
    """The queue-proxy's ports were refused in the profile for every kind (plain Kubernetes has
    no queue-proxy), and a function's own grpc_port of 9090 passed under protocol = "grpc"."""
    reserved = settings(port=8012)
    for render in (knative_service, inference_service):
        with pytest.raises(ConfigError, match=r"\[settings\] port 8012 is reserved"):
            render(workload(bundle, reserved, IMAGE))
    deployment = plain_kubernetes(workload(bundle, settings(port=9090, min_scale=1), IMAGE))[0]
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 9090
    )
    grpc = settings(protocol="grpc", grpc_port=9090)
    with pytest.raises(ConfigError, match=r"the gRPC port .* 9090 is reserved"):
        knative_service(workload(grpc_bundle, grpc, IMAGE))


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("min_scale = 5\nmax_scale = 2", "min_scale 5 is above max_scale 2"),
        ('service_account = "My_SA"', "service_account"),
        ('image_pull_secret = "bad secret!"', "image_pull_secret"),
        ('registry = "https://registry.example.com"', "registry"),
        ('registry = "Registry.Example.COM/Team"', "registry"),
        ("ready_timeout_s = 1e10", "ready_timeout_s"),
    ],
)
def test_profile_values_the_api_server_refuses_are_refused_in_the_profile(
    tmp_path: Path, written: str, said: str
) -> None:
    """Each was copied into the manifests (a ServiceAccount named My_SA, HPA min 5 over max 2,
    a failureThreshold past int32) or into an image name podman refused minutes later."""
    for kind in ("knative", "kserve", "kubernetes"):
        profile = tmp_path / f"{kind}.toml"
        profile.write_text(f'driver = "{kind}"\n[settings]\nmin_scale = 1\n{written}\n')
        if "min_scale = 5" in written:
            profile.write_text(f'driver = "{kind}"\n[settings]\n{written}\n')
        with pytest.raises(ConfigError, match=said):
            load_target(profile).settings_as(KubernetesSettings)


def test_knative_bounds_are_refused_at_build_naming_the_setting(bundle: Bundle) -> None:
    """containerConcurrency past 1000 and timeoutSeconds past 600 (Knative's default bounds,
    which its webhook enforces) were written as given; a version with build metadata made a
    label value the API server refuses and an image tag podman refused."""
    over = settings(container_concurrency=5000)
    with pytest.raises(ConfigError, match="container_concurrency = 5000 is over Knative"):
        knative_service(workload(bundle, over, IMAGE))
    slow = dataclasses.replace(workload(bundle, settings(), IMAGE), request_timeout_s=900.0)
    for render in (knative_service, inference_service):
        with pytest.raises(ConfigError, match=r"timeoutSeconds would be 900 .*timeout_ms"):
            render(slow)
    built = dataclasses.replace(
        workload(bundle, settings(min_scale=1), IMAGE), version="1.2.0+build.5"
    )
    for kind in ("knative", "kserve", "kubernetes"):
        with pytest.raises(ConfigError, match=r"\[function\] version '1.2.0\+build.5' labels"):
            render_kind(kind, built)


def test_plain_kubernetes_honours_initial_scale_and_the_scale_down_delay(bundle: Bundle) -> None:
    """Both were dropped in silence on plain Kubernetes; Knative's concurrency settings, which
    HPA has no use for, are refused by name."""
    chosen = settings(min_scale=2, max_scale=9, initial_scale=4, scale_down_delay_s=600)
    deployment, _, hpa = plain_kubernetes(workload(bundle, chosen, IMAGE))
    assert deployment["spec"]["replicas"] == 4
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    plain = plain_kubernetes(workload(bundle, settings(min_scale=2), IMAGE))[2]
    assert "behavior" not in plain["spec"]
    with pytest.raises(ConfigError, match=r"\[settings\] target and container_concurrency"):
        plain_kubernetes(
            workload(bundle, settings(min_scale=1, target=5, container_concurrency=7), IMAGE)
        )


@pytest.mark.parametrize(
    ("max_batch", "instances", "queue", "batched", "expected"),
    [
        (16, 2, 256, True, Concurrency(32, 64)),
        (32, 1, 40, True, Concurrency(32, 40)),  # the limit never exceeds the queue
        (32, 1, 16, True, Concurrency(16, 16)),
        (32, 3, 1024, False, Concurrency(3, 6)),  # no batch axis: one request per instance
        (1, 1, 1024, True, Concurrency(1, 2)),
        (512, 1, 1024, True, Concurrency(512, 1000)),  # within Knative's default bound
    ],
)
def test_concurrency_is_derived_from_batching(
    max_batch: int, instances: int, queue: int, batched: bool, expected: Concurrency
) -> None:
    batching = BatchingSection(max_batch_size=max_batch, instances=instances, max_queue_size=queue)
    assert derive_concurrency(batching, batched) == expected


def test_profile_values_replace_the_derived_ones(bundle: Bundle) -> None:
    work = workload(bundle, settings(target=5, container_concurrency=0), IMAGE)
    assert work.concurrency == Concurrency(5, 0)
    service = knative_service(work)
    assert service["spec"]["template"]["spec"]["containerConcurrency"] == 0


def test_a_gpu_profile_asks_for_gpus_and_ships_onnxruntime_gpu(bundle: Bundle) -> None:
    gpu = settings(gpu=1)
    limits = knative_service(workload(bundle, gpu, IMAGE))["spec"]["template"]["spec"][
        "containers"
    ][0]["resources"]["limits"]
    assert limits == {"memory": "1536Mi", "nvidia.com/gpu": "1"}
    pinned = bundle.requirements("knative")
    assert any(line.startswith("onnxruntime==") for line in pinned)
    swapped = image_requirements(pinned, gpu)
    assert "onnxruntime-gpu" in swapped
    assert not [line for line in swapped if line.startswith(("onnxruntime=", "openvino"))]
    assert image_requirements(pinned, settings()) == tuple(pinned)


@pytest.mark.parametrize(("cpu", "cores"), [("1", "1"), ("500m", "1"), ("2500m", "2"), ("4", "4")])
def test_the_server_plans_its_processes_for_the_cpu_requested_not_the_node(
    bundle: Bundle, cpu: str, cores: str
) -> None:
    """No CPU limit is set, so the pod sees every core of its node: without EDGESERVE_CORES
    `serve` would start fronts and inference processes (and their memory) for all of them."""
    work = workload(bundle, settings(cpu=cpu, min_scale=1), IMAGE)
    service = knative_service(work)
    template = service["spec"]["template"]
    assert knative_admission_errors(template["spec"]) == []
    assert schema_errors("knative-service", service) == []
    containers = [
        template["spec"]["containers"][0],
        inference_service(work)["spec"]["predictor"]["containers"][0],
        plain_kubernetes(work)[0]["spec"]["template"]["spec"]["containers"][0],
    ]
    for container in containers:
        assert {"name": "EDGESERVE_CORES", "value": cores} in container["env"]
        assert container["resources"]["requests"]["cpu"] == cpu


def test_a_cpu_request_kubernetes_cannot_read_is_refused_in_the_profile(tmp_path: Path) -> None:
    profile = tmp_path / "knative.toml"
    profile.write_text('driver = "knative"\n[settings]\ncpu = "two"\n')
    with pytest.raises(ConfigError, match="cpu"):
        load_target(profile).settings_as(KubernetesSettings)


def test_plain_kubernetes_deployment_service_and_hpa(bundle: Bundle) -> None:
    work = workload(bundle, settings(min_scale=2, max_scale=9), IMAGE)
    deployment, service, hpa = plain_kubernetes(work)
    assert [d["kind"] for d in (deployment, service, hpa)] == [
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
    ]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert pod["terminationGracePeriodSeconds"] > DRAIN_S + 5
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert deployment["spec"]["replicas"] == 2
    assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 9
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("scale", ["min_scale = 0\n", ""])  # written, or the default
def test_build_refuses_scale_to_zero_on_plain_kubernetes(
    bundle: Bundle, tmp_path: Path, scale: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """HPA keeps at least one pod: `build --target` a plain Kubernetes profile asking for zero
    fails with the profile file and field named, before any image is built."""
    profile = tmp_path / "k8s-zero.toml"
    profile.write_text(f'driver = "kubernetes"\n[settings]\n{scale}max_scale = 3\n')
    source = write_function(tmp_path / "src", mlp_model, MANIFEST)
    capsys.readouterr()
    argv = ["build", str(source), "--out", str(tmp_path / "out"), "--target", str(profile)]
    assert main(argv) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{profile} [settings] min_scale = 0" in said
    assert "plain Kubernetes (HPA) cannot scale to zero" in said
    assert "--target knative or --target kserve" in said
    assert not (tmp_path / "dist").exists()  # nothing packaged
    with pytest.raises(
        ConfigError, match=r"\[settings\] min_scale = 0 .*: plain Kubernetes \(HPA\) cannot"
    ):
        plain_kubernetes(workload(bundle, settings(min_scale=0), IMAGE))


def test_the_yaml_written_by_package_round_trips(bundle: Bundle) -> None:
    text = KNATIVE.manifests_yaml(bundle, settings(), IMAGE)
    assert list(yaml.safe_load_all(text)) == [knative_service(workload(bundle, settings(), IMAGE))]


@pytest.mark.parametrize(
    ("kind", "name", "words"),
    [
        ("knative", "my_model", "need a DNS-1035 label"),
        ("knative", "a" * 53, f"knative names a '{'a' * 53}-0123456789' after it, which must "
         "stay within 63 characters; expected a name of at most 52"),
        ("kserve", "b" * 48, f"kserve names a '{'b' * 48}-predictor-00001' after it, which must "
         "stay within 63 characters; expected a name of at most 47"),
    ],
)  # fmt: skip
def test_a_name_the_cluster_cannot_use_is_refused_before_any_image_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, name: str, words: str
) -> None:
    """Refused by `build --target` before the bundle and the image (no podman is needed to see
    it): a 53-letter name made a 64-letter Knative revision name, which the cluster refuses
    after the push; and "built" was printed before the refusal."""
    source = write_function(tmp_path / "src", mlp_model, f'[function]\nname = "{name}"\n')
    code = main(["build", str(source), "--out", str(tmp_path / "b"), "--target", kind])
    assert code == 2
    printed = capsys.readouterr()
    assert words in " ".join(printed.err.split())
    assert "built" not in printed.out and not (tmp_path / "b").exists()


def test_the_shipped_gpu_profile_asks_for_a_gpu_and_stays_warm(bundle: Bundle) -> None:
    gpu = load_target("knative-gpu").settings_as(KubernetesSettings)
    service = knative_service(workload(bundle, gpu, IMAGE))
    template = service["spec"]["template"]
    assert schema_errors("knative-service", service) == []
    assert template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    notes = template["metadata"]["annotations"]
    assert notes["autoscaling.knative.dev/min-scale"] == "1"
    assert notes["autoscaling.knative.dev/scale-down-delay"] == "300s"


@pytest.fixture(scope="module")
def grpc_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """The scorer asking for gRPC on Triton's port, 8001."""
    root = tmp_path_factory.mktemp("k8s-grpc")
    source = write_function(root / "src", mlp_model, MANIFEST + "grpc_port = 8001\n")
    return build(source, root / "bundle", targets=("knative", "kserve", "kubernetes"))


def test_plain_kubernetes_serves_grpc_on_a_second_port_named_grpc(grpc_bundle: Bundle) -> None:
    deployment, service, _ = plain_kubernetes(workload(grpc_bundle, settings(min_scale=1), IMAGE))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "grpc", "containerPort": 8001, "protocol": "TCP"},
    ]
    assert container["readinessProbe"]["httpGet"]["port"] == "http"  # health stays on HTTP
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http"},
        {"name": "grpc", "port": 8001, "targetPort": "grpc", "appProtocol": "kubernetes.io/h2c"},
    ]
    plan = image_plan(grpc_bundle, "kubernetes", settings(min_scale=1))
    text = plan.containerfile()
    assert "EXPOSE 8080 8001\n" in text
    assert '"--port", "8080", "--grpc-port", "8001"]' in text
    assert any(line.startswith("grpcio==") for line in plan.requirements)  # pinned by build


def test_the_profile_grpc_port_wins_and_protocol_http_turns_grpc_off(grpc_bundle: Bundle) -> None:
    work = workload(grpc_bundle, settings(min_scale=1, grpc_port=9000), IMAGE)
    assert plain_kubernetes(work)[1]["spec"]["ports"][1]["port"] == 9000
    work = workload(grpc_bundle, settings(min_scale=1, protocol="http"), IMAGE)
    assert [p["name"] for p in plain_kubernetes(work)[1]["spec"]["ports"]] == ["http"]
    plan = image_plan(grpc_bundle, "kubernetes", settings(protocol="http"))
    assert "--grpc-port" not in plan.containerfile()
    with pytest.raises(ConfigError, match="plain Kubernetes serves HTTP and gRPC on two ports"):
        plain_kubernetes(workload(grpc_bundle, settings(min_scale=1, protocol="grpc"), IMAGE))
    # a function that does not ask for gRPC gets grpcio in its image when the profile asks
    assert any(r.startswith("grpcio") for r in image_requirements([], settings(), grpc=True))


@pytest.mark.parametrize("kind", ["knative", "kserve"])
def test_knative_and_kserve_refuse_grpc_beside_http_before_the_image(
    grpc_bundle: Bundle, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Knative routes one container port: a function asking for gRPC is told to choose, by
    `build --target`, naming the profile, before any image is built (no podman needed)."""
    source = write_function(tmp_path / "src", mlp_model, MANIFEST + "grpc_port = 8001\n")
    out = tmp_path / "out"
    assert main(["build", str(source), "--out", str(out), "--target", kind]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{kind}.toml: the function asks for gRPC on port 8001" in said
    assert "Knative and KServe route one container port, HTTP/1 or HTTP/2 (h2c), not both" in said
    assert 'protocol = "http" serves HTTP only (gRPC off), protocol = "grpc" serves only' in said
    assert not (tmp_path / "dist").exists()


def test_protocol_grpc_serves_grpc_on_the_one_port_named_h2c(grpc_bundle: Bundle) -> None:
    """As KServe documents for v2 gRPC: the port named h2c; probed by TCP (the gRPC port opens
    once the model is loaded and warmed up)."""
    grpc = settings(protocol="grpc")
    service = knative_service(workload(grpc_bundle, grpc, IMAGE))
    isvc = inference_service(workload(grpc_bundle, grpc, IMAGE))
    assert schema_errors("knative-service", service) == []
    assert schema_errors("kserve-inferenceservice", isvc) == []
    for pod in (service["spec"]["template"]["spec"], isvc["spec"]["predictor"]):
        assert knative_admission_errors(pod) == []
        container = pod["containers"][0]
        assert container["ports"] == [{"name": "h2c", "containerPort": 8001, "protocol": "TCP"}]
        assert container["readinessProbe"] == {"tcpSocket": {"port": 8001}}
    assert '"--grpc-port", "8001"]' in image_plan(grpc_bundle, "knative", grpc).containerfile()
    http = settings(protocol="http")
    container = knative_service(workload(grpc_bundle, http, IMAGE))["spec"]["template"]["spec"]
    assert container["containers"][0]["ports"][0]["name"] == "http1"


def test_a_grpc_port_equal_to_the_http_port_is_refused_in_the_profile(tmp_path: Path) -> None:
    profile = tmp_path / "kubernetes.toml"
    profile.write_text('driver = "kubernetes"\n[settings]\nport = 8001\ngrpc_port = 8001\n')
    with pytest.raises(ConfigError, match="grpc_port 8001 is the HTTP port too"):
        load_target(profile).settings_as(KubernetesSettings)

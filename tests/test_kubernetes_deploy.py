"""Apply / wait / status / rollback against a STAND-IN for the Kubernetes API server
(tests/kube_standin.py): no kube-apiserver, Knative or KServe controller can run here, so
these show edgeserve's side of the protocol (kubeconfig and token, server-side apply, merge
patches, the waits, which revision gets traffic when) and not how a live cluster answers.

The stand-in decides readiness by image name: `never-ready` never becomes ready, `crash` fails.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.errors import DeployError
from edgeserve.kubernetes.driver import workload
from edgeserve.kubernetes.manifests import render
from edgeserve.kubernetes.rollouts import rollout_for
from edgeserve.kubernetes.settings import KubernetesSettings
from tests.kube_standin import Store, stand_in_api_server
from tests.models import mlp_model, write_function
from tests.stalling import stalling_server

REPO = "registry.example.com/team/mlp@sha256:"
GOOD_1, GOOD_2 = REPO + "1" * 64, REPO + "2" * 64
NEVER_READY = "registry.example.com/team/never-ready@sha256:" + "3" * 64
CRASH = "registry.example.com/team/crash@sha256:" + "4" * 64


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("deploy")
    source = write_function(root / "src", mlp_model, '[function]\nname = "mlp"\nversion = "1"\n')
    return build(source, root / "bundle", targets=("knative", "kserve", "kubernetes"))


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[tuple[KubernetesSettings, Store, Path]]:
    with stand_in_api_server(tmp_path) as (kubeconfig, store):
        settings = KubernetesSettings(
            kubeconfig=str(kubeconfig), namespace="models", ready_timeout_s=3, min_scale=1
        )
        yield settings, store, kubeconfig


def ship(kind: str, bundle: Bundle, settings: KubernetesSettings, image: str, version: str):
    work = replace(workload(bundle, settings, image), version=version)  # as a new release
    manifests = render(kind, work)
    return rollout_for(kind, settings).deploy("mlp", version, manifests)


def profile(folder: Path, kind: str, kubeconfig: Path) -> Path:
    path = folder / f"{kind}-stand-in.toml"
    path.write_text(
        f'driver = "{kind}"\n[settings]\nkubeconfig = "{kubeconfig}"\n'
        'namespace = "models"\nready_timeout_s = 3\nmin_scale = 1\n'
    )
    return path


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_knative_deploy_moves_traffic_only_to_a_ready_revision_stand_in(
    bundle: Bundle,
    stand_in: tuple[KubernetesSettings, Store, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, _, kubeconfig = stand_in
    first = ship("knative", bundle, settings, GOOD_1, "1")
    assert first.url == "http://mlp.models.example.com" and first.previous_version is None
    second = ship("knative", bundle, settings, GOOD_2, "2")
    assert second.previous_version == first.details["revision"]
    with pytest.raises(DeployError, match=f"traffic stays on {second.details['revision']}"):
        ship("knative", bundle, settings, NEVER_READY, "3")
    target = str(profile(tmp_path, "knative", kubeconfig))
    status = cli_json(capsys, "status", "mlp", "--target", target)
    assert status["traffic"] == [{"revision": second.details["revision"], "percent": 100}]
    assert [(r["version"], r["ready"]) for r in status["revisions"]] == [
        ("1", True),
        ("2", True),
        ("3", False),
    ]

    assert main(["rollback", "mlp", "--target", target]) == 0
    assert "rolled back mlp on knative to 1" in capsys.readouterr().out
    status = cli_json(capsys, "status", "mlp", "--target", target)
    assert status["traffic"] == [{"revision": first.details["revision"], "percent": 100}]


def test_knative_a_failing_first_revision_fails_the_deploy_stand_in(
    bundle: Bundle, stand_in: tuple[KubernetesSettings, Store, Path]
) -> None:
    settings, _, _ = stand_in
    with pytest.raises(DeployError, match=r"failed: ExitCode1.*no revision was serving before"):
        ship("knative", bundle, settings, CRASH, "1")


def test_kserve_canary_zero_until_ready_then_rollback_stand_in(
    bundle: Bundle,
    stand_in: tuple[KubernetesSettings, Store, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, _, kubeconfig = stand_in
    first = ship("kserve", bundle, settings, GOOD_1, "1")
    second = ship("kserve", bundle, settings, GOOD_2, "2")
    assert (first.details["revision"], second.previous_version) == ("mlp-predictor-00001",) * 2
    with pytest.raises(
        DeployError, match="did not become ready within 3s; traffic stays on mlp-predictor-00002"
    ):
        ship("kserve", bundle, settings, NEVER_READY, "3")
    target = str(profile(tmp_path, "kserve", kubeconfig))
    status = cli_json(capsys, "status", "mlp", "--target", target)
    assert status["traffic"][-1] == {"revision": "mlp-predictor-00002", "percent": 100}
    assert status["canary_traffic_percent"] == 0  # the failed revision was never promoted

    fixed = ship("kserve", bundle, settings, GOOD_1.replace("1", "5"), "4")
    assert main(["rollback", "mlp", "--target", target]) == 0
    status = cli_json(capsys, "status", "mlp", "--target", target)
    assert {"revision": fixed.previous_version, "percent": 100} in status["traffic"]


def test_kserve_status_shows_each_predictor_revisions_replicas_stand_in(
    bundle: Bundle,
    stand_in: tuple[KubernetesSettings, Store, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The predictor's revisions are the Knative Service `mlp-predictor`'s, read as for knative:
    the one that never became ready has 0 of its 1 desired replica."""
    settings, _, kubeconfig = stand_in
    ship("kserve", bundle, settings, GOOD_1, "1")
    ship("kserve", bundle, settings, GOOD_2, "2")
    with pytest.raises(DeployError, match="did not become ready"):
        ship("kserve", bundle, settings, NEVER_READY, "3")
    target = str(profile(tmp_path, "kserve", kubeconfig))
    status = cli_json(capsys, "status", "mlp", "--target", target)
    rows = [
        (r["name"], r["version"], r["ready"], r["replicas"], r["desired_replicas"], r["image"])
        for r in status["revisions"]
    ]
    assert rows == [
        ("mlp-predictor-00001", "1", True, 1, 1, GOOD_1),
        ("mlp-predictor-00002", "2", True, 1, 1, GOOD_2),
        ("mlp-predictor-00003", "3", False, 0, 1, NEVER_READY),
    ]


def test_kubernetes_rollout_undo_and_rollback_stand_in(
    bundle: Bundle,
    stand_in: tuple[KubernetesSettings, Store, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, _, kubeconfig = stand_in
    first = ship("kubernetes", bundle, settings, GOOD_1, "1")
    assert first.url == "http://mlp.models.svc.cluster.local"
    ship("kubernetes", bundle, settings, GOOD_2, "2")
    with pytest.raises(DeployError, match="rolled back to the previous pod template"):
        ship("kubernetes", bundle, settings, CRASH, "3")
    target = str(profile(tmp_path, "kubernetes", kubeconfig))
    status = cli_json(capsys, "status", "mlp", "--target", target)
    live = [r for r in status["revisions"] if r["revision"] == status["revision"]]
    assert live[0]["image"] == GOOD_2  # the crashing template was undone
    assert main(["rollback", "mlp", "--target", target]) == 0
    status = cli_json(capsys, "status", "mlp", "--target", target)
    live = [r for r in status["revisions"] if r["revision"] == status["revision"]]
    assert live[0]["image"] == GOOD_1


def test_a_wrong_token_is_an_error_naming_the_server_stand_in(
    bundle: Bundle, stand_in: tuple[KubernetesSettings, Store, Path], tmp_path: Path
) -> None:
    settings, _, kubeconfig = stand_in
    config = json.loads(kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "wrong"
    other = tmp_path / "wrong-kubeconfig"
    other.write_text(json.dumps(config))
    wrong = settings.model_copy(update={"kubeconfig": str(other)})
    with pytest.raises(
        DeployError, match=r"http://127\.0\.0\.1:\d+ namespace models.*Unauthorized"
    ):
        ship("knative", bundle, wrong, GOOD_1, "1")


def test_the_profile_context_picks_the_cluster_stand_in(
    bundle: Bundle, stand_in: tuple[KubernetesSettings, Store, Path], tmp_path: Path
) -> None:
    """The kubeconfig's current context names a dead server; `context` picks the stand-in."""
    settings, store, kubeconfig = stand_in
    config = json.loads(kubeconfig.read_text())
    config["clusters"].append({"name": "dead", "cluster": {"server": "http://127.0.0.1:9"}})
    config["contexts"].append({"name": "dead", "context": {"cluster": "dead", "user": "edgeserve"}})
    config["current-context"] = "dead"
    two = tmp_path / "two-contexts"
    two.write_text(json.dumps(config))
    chosen = settings.model_copy(update={"kubeconfig": str(two), "context": "stand-in"})
    assert ship("knative", bundle, chosen, GOOD_1, "1").url == "http://mlp.models.example.com"
    assert store.read(("serving.knative.dev/v1", "services", "models", "mlp")) is not None
    with pytest.raises(DeployError, match=r"127\.0\.0\.1:9 namespace models"):
        ship("knative", bundle, settings.model_copy(update={"kubeconfig": str(two)}), GOOD_1, "1")


def kubeconfig_for(path: Path, port: int) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        f'clusters: [{{name: k, cluster: {{server: "http://127.0.0.1:{port}"}}}}]\n'
        "users: [{name: u, user: {token: t}}]\n"
    )
    return path


def test_an_api_server_that_accepts_and_never_answers_fails_in_bounded_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real TCP server that accepts and stays silent (no stand-in needed): `status` used to
    wait for its answer forever."""
    with stalling_server() as port:
        kubeconfig = kubeconfig_for(tmp_path / "kubeconfig", port)
        target = profile(tmp_path, "knative", kubeconfig)
        target.write_text(target.read_text() + "request_timeout_s = 0.5\n")
        started = time.monotonic()
        code = main(["status", "mlp", "--target", str(target)])
    assert (code, time.monotonic() - started < 10) == (3, True)
    assert "no answer within 0.5 s (request_timeout_s)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text", ["apiVersion: v1\nclusters: [\n  - name: x\n", "- just\n- a list\n", "hello\n"],
    ids=["invalid-yaml", "list", "scalar"],
)  # fmt: skip
def test_a_malformed_kubeconfig_is_a_config_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    code = main(["status", "mlp", "--target", str(profile(tmp_path, "knative", kubeconfig))])
    err = capsys.readouterr().err
    assert (code, err.count("\n")) == (2, 1), err
    assert f"kubeconfig {kubeconfig}: not a kubeconfig (a YAML mapping" in err


def test_deploy_reads_the_kubeconfig_before_building_the_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kubeconfig that cannot be read is the first thing `deploy` reports: before, the image
    was built and pushed first (here the build failed first, pulling the default base)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("- just\n- a list\n")
    target = profile(tmp_path, "knative", kubeconfig)
    target.write_text(target.read_text() + 'registry = "127.0.0.1:9/team"\n')
    source = write_function(tmp_path / "mlp", mlp_model, '[function]\nname = "mlp"\n')
    capsys.readouterr()
    code = main(["deploy", str(source), "--target", str(target)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert f"kubeconfig {kubeconfig}: not a kubeconfig" in err


def test_a_newcomer_without_a_cluster_is_told_how_to_get_the_manifests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`deploy --target knative` with the shipped profile said "settings.registry is empty"
    naming the profile inside the installed package, and, with a registry but no kubeconfig,
    the client's "Invalid kube-config file. No configuration found.": neither said where to
    set the registry, that no kubeconfig was found, or how to get manifests without one."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    source = write_function(tmp_path / "mlp", mlp_model, '[function]\nname = "mlp"\n')
    capsys.readouterr()
    assert main(["deploy", str(source), "--target", "knative"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "knative.toml: settings.registry is empty; a cluster pulls images from a registry. " in err
    )
    assert "in a knative.toml of your own (a copy of this one) in the function's folder" in err
    (source / "knative.toml").write_text(
        'driver = "knative"\n[settings]\nregistry = "127.0.0.1:9/team"\n'
    )
    assert main(["deploy", str(source), "--target", "knative"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (
        "error: kubeconfig ~/.kube/config: no such file; deploy, status and rollback talk to the "
        "cluster a kubeconfig names. Hint: set $KUBECONFIG or `kubeconfig` in the target "
        "profile; without a cluster, `edgeserve build SOURCE --target knative` (or kserve, "
        "kubernetes) builds the image and writes its manifests.yaml"
    )

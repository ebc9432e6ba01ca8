"""`edgeserve doctor FUNCTION`: the steps of serving one function on this machine, each run
with the code `build` and `serve` run and reported as a `doctor.Finding`:

    manifest  load_manifest, or Bundle.open; a model alone is examined as the function
              `edgeserve init` makes of it
    model     its tensors as read_model (build) reads them: dtypes, dims, batch axis, padding
    build     a source's plan_build, build's checks (check_source) and write_bundle
    backend   the choice (backends.choose) and a real load (LocalEngine.load), bounded in time;
              where the model fails to load, whether the next backend loads it (serve does not
              fall back by itself)
    handler   import_handler, and [handler] requirements against what is installed here
    warm-up   the runtime's start, then each sample sent to the function's own app in this
              process, as bench sends it: its latency, or the error a client gets
    layout    the processes `serve` would start here (server.plan_layout)

A step that fails is a finding, and the steps that do not need it still run. Bundles go to
a scratch folder, never to the bundle cache, which holds only what passed build's checks.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import httpx

from edgeserve.backends import BY_NAME, Choice, choose, forced, probe
from edgeserve.bench.inputs import Body, ModelInputs, sample_bodies
from edgeserve.builder import BuildPlan, check_source, plan_build, read_model, write_bundle
from edgeserve.bundle import Bundle, is_function_source
from edgeserve.dataplane import DataPlane, serving
from edgeserve.doctor import Finding, Report, model_finding, requirements_finding
from edgeserve.engine import LocalEngine
from edgeserve.errors import (
    BackendError,
    ConfigError,
    EdgeserveError,
    as_edgeserve_error,
    echo,
)
from edgeserve.handler import import_handler, unmet_requirements
from edgeserve.hardware import Platform
from edgeserve.http.app import FunctionApp, create_app
from edgeserve.manifest import MANIFEST_NAME, Manifest, load_manifest
from edgeserve.runtime import Runtime
from edgeserve.scaffold import init_function
from edgeserve.server import plan_layout
from edgeserve.stats import ModelStats

STEPS = ("manifest", "model", "build", "backend", "handler", "warm-up", "layout")
SLOW = (
    "a first load on TensorRT builds its engine (`edgeserve engine build BUNDLE` caches it); "
    "else give it longer, doctor --load-timeout S (doctor exits once the load ends)"
)
NO_SAMPLES = (
    "add requests to samples/ (images, /invoke or v2 JSON): doctor, build, bench and the "
    "warm-up run them"
)


@dataclass(frozen=True)
class _Function:
    """The function as serve would have it, and the bundle serve would load on a backend."""

    name: str
    manifest: Manifest
    planned: tuple[str, ...]  # the backends it plans, best first (Bundle.planned_backends)
    handler: tuple[Path, Path] | None  # the file to import, and the file it is shown as
    bundle_for: Callable[[str], Bundle]
    source: bool  # a function folder (or a model alone), not a built bundle
    alias: tuple[str, str] | None = None  # a model alone: its copy's path, and the user's


@dataclass(frozen=True)
class _Loaded:
    bundle: Bundle
    engine: LocalEngine
    stats: ModelStats
    seconds: float


def examine(path: Path, *, backend: str | None = None, timeout_s: float) -> Report:
    """Every step of serving the function, bundle or model at `path` here (`backend`: as
    `serve --backend` would), each a Finding; loading the model on a backend may take
    `timeout_s`, then it is reported as a failure."""
    with tempfile.TemporaryDirectory(prefix="edgeserve-doctor-") as scratch:
        findings, function = _open(path, Path(scratch), backend)
        if function is None:
            done = STEPS.index(findings[-1].check) + 1
            skipped = [Finding.skipped(step, "needs the steps above") for step in STEPS[done:]]
            return Report(str(path), (*findings, *skipped))
        findings += _serve(function, backend, timeout_s)
        if function.alias is not None:  # messages name the user's model, not a scratch copy
            findings = [finding.renamed(*function.alias) for finding in findings]
        return Report(function.name, tuple(findings))


def _open(path: Path, scratch: Path, backend: str | None) -> tuple[list[Finding], _Function | None]:
    """The function at `path`; a source is built as serve builds it (`backend`: forced)."""
    if path.suffix.lower() == ".onnx" and path.is_file():
        return _open_model(path, scratch, backend)
    if is_function_source(path):
        return _open_source(path, scratch, backend)
    try:
        bundle = Bundle.open(path)
    except EdgeserveError as exc:
        return [Finding.failed("manifest", exc)], None
    built = f"built for {', '.join(bundle.targets)}, hash {bundle.content_hash[:12]}"
    opened = Finding("manifest", "ok", f"the bundle of {_named(bundle.manifest)}, {built}")
    handler = bundle.handler_path
    function = _Function(
        bundle.name,
        bundle.manifest,
        bundle.planned_backends(),
        None if handler is None else (handler, bundle.handler_source or handler),
        partial(_given, bundle),
        source=False,
    )
    return [opened, model_finding(bundle.signature, bundle.manifest)], function


def _open_model(
    model: Path, scratch: Path, backend: str | None
) -> tuple[list[Finding], _Function | None]:
    """A model alone, as the function `edgeserve init` makes of it (named after the file)."""
    init = f"edgeserve init {shlex.quote(model.stem)} --model {shlex.quote(str(model))}"
    try:
        source = init_function(scratch / "source" / model.stem, model=model)
    except EdgeserveError as exc:
        return [Finding.failed("manifest", exc)], None
    note = Finding(
        "manifest",
        "note",
        f"none: {model} is a model alone, examined as the function `{init}` makes of it",
        f"{init}, then edgeserve serve {shlex.quote(model.stem)}",
    )
    findings, function = _open_source(source, scratch, backend, note)
    alias = (str(source / model.name), str(model))
    return findings, function and replace(function, alias=alias)


def _open_source(
    source: Path, scratch: Path, backend: str | None, note: Finding | None = None
) -> tuple[list[Finding], _Function | None]:
    try:
        manifest = load_manifest(source)
    except EdgeserveError as exc:
        return [Finding.failed("manifest", exc)], None
    findings = [note or Finding("manifest", "ok", f"{source / MANIFEST_NAME}: {_named(manifest)}")]
    try:
        signature = read_model(source, manifest)[1]
    except EdgeserveError as exc:
        return [*findings, Finding.failed("model", exc)], None
    findings.append(model_finding(signature, manifest))
    try:
        plan = plan_build(source, backend=forced(backend, probe()))
    except EdgeserveError as exc:
        return [*findings, Finding.failed("build", exc)], None
    built, bundle_for = _build(source, plan, scratch)
    module = manifest.handler.module
    handler = None if module is None else source / f"{module}.py"
    function = _Function(
        manifest.function.name,
        manifest,
        plan.preferred,
        None if handler is None else (handler, handler),
        bundle_for,
        source=True,
    )
    return [*findings, built], function


def _build(source: Path, plan: BuildPlan, scratch: Path) -> tuple[Finding, Callable[[str], Bundle]]:
    """Build's checks and bundle (serve's own), and where to find a bundle for a backend."""
    checks: list[str] = []
    try:
        done = write_bundle(
            plan,
            scratch / "bundle",
            check=partial(check_source, source),
            report=lambda check: checks.append(check.describe()),
        )
        bundle = replace(done, source=source)
    except EdgeserveError as exc:
        return Finding.failed("build", exc), partial(_bundle_for, source, scratch)
    warned = any(said.startswith("warning: ") for said in checks)
    passed = "passes: " + "; ".join(checks) if checks else "passes (no check applies)"
    return Finding("build", "note" if warned else "ok", passed), partial(_given, bundle)


def _given(bundle: Bundle, backend: str) -> Bundle:
    """The one bundle serve loads, whatever the backend."""
    return bundle


def _bundle_for(source: Path, scratch: Path, backend: str) -> Bundle:
    """Where build refuses the source: a bundle planned for `backend` alone, so that the
    backend is tried all the same (its preparing of the model, an IR, may be what fails)."""
    plan = plan_build(source, backend=backend)
    return replace(write_bundle(plan, scratch / backend), source=source)


def _named(manifest: Manifest) -> str:
    return f"{manifest.function.name} version {manifest.function.version}"


def _serve(function: _Function, backend: str | None, timeout_s: float) -> list[Finding]:
    """The backend, the handler, the warm-up and samples, and the layout."""
    platform = probe()
    try:
        choice = choose(platform, prefer=function.planned, override=backend)
    except EdgeserveError as exc:
        rest = [Finding.skipped(step, "needs a backend") for step in ("warm-up", "layout")]
        return [Finding.failed("backend", exc), *_handler(function), *rest]
    loaded, found = _backend(function, platform, choice, timeout_s)
    handler = _handler(function)
    findings = [found, *handler]
    if loaded is not None and handler[0].error is None:
        findings += _samples(loaded)
    else:
        needs = "the model loaded" if loaded is None else "a handler that imports"
        findings.append(Finding.skipped("warm-up", f"needs {needs}"))
        if loaded is not None:
            loaded.engine.backend.close()
    return [*findings, _layout(function, loaded, choice.name)]


def _backend(
    function: _Function, platform: Platform, choice: Choice, timeout_s: float
) -> tuple[_Loaded | None, Finding]:
    said = f"{choice.name}: {choice.reason}"
    if choice.rejected:
        said += " (" + "; ".join(f"not {name}: {why}" for name, why in choice.rejected) + ")"
    try:
        loaded = _load(function.bundle_for(choice.name), choice.name, timeout_s)
    except EdgeserveError as exc:
        fallback = _fallback(function, platform, choice, timeout_s)
        return None, Finding.failed("backend", exc, fallback, f"{said}. It fails on the model: ")
    if loaded is None:
        slow = BackendError(f"still loading the model after {timeout_s:g} s. Hint: {SLOW}")
        return None, Finding.failed("backend", slow, said=f"{said}. It is ")
    return loaded, Finding("backend", "ok", f"{said}; loads the model in {_ms(loaded.seconds)}")


def _load(bundle: Bundle, backend: str, timeout_s: float) -> _Loaded | None:
    """The bundle loaded on `backend` as a Runtime loads it, on a thread waited for at most
    `timeout_s`: None if still loading then (a stuck driver, or TensorRT building an engine
    for minutes, is reported rather than waited for; the process still waits for the thread
    before it exits, since a backend's threads cannot be cut off in the middle)."""
    stats = ModelStats(bundle.name, bundle.manifest.function.model_version)
    loading: Future[LocalEngine] = Future()

    def load() -> None:
        try:
            loading.set_result(LocalEngine.load(bundle, stats=stats, backend=backend))
        except Exception as exc:  # handed to the waiting thread, a foreign one translated
            loading.set_exception(as_edgeserve_error(exc, f"loading on {backend}"))

    started = time.perf_counter()
    threading.Thread(target=load, name=f"doctor-{backend}").start()
    try:
        engine = loading.result(timeout=timeout_s)
    except TimeoutError:
        return None
    return _Loaded(bundle, engine, stats, time.perf_counter() - started)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _fallback(function: _Function, platform: Platform, failed: Choice, timeout_s: float) -> str:
    """Serve stops where the chosen backend fails: whether the next one it would choose,
    were this one left out, loads the model (tried), and how to choose it."""
    stops = "serve stops here: it does not fall back to another backend"
    rest = [name for name in dict.fromkeys((*function.planned, *BY_NAME)) if name != failed.name]
    try:
        other = choose(platform, prefer=rest).name
    except EdgeserveError:
        return f"{stops}, and no other backend is usable here"
    if other == failed.name:  # forced by EDGESERVE_BACKEND
        return stops
    try:
        loaded = _load(function.bundle_for(other), other, timeout_s)
    except EdgeserveError as exc:
        return f"{stops}; {other} does not load it either: {exc.message}"
    if loaded is None:
        return f"{stops}; {other} did not load it within {timeout_s:g} s either"
    loaded.engine.backend.close()
    how = (
        f'[backend] prefer = ["{other}"] in its {MANIFEST_NAME}'
        if function.source
        else f"serve --backend {other} (or EDGESERVE_BACKEND={other})"
    )
    return f"{stops}; {other} loads this model here (tried): {how}"


def _handler(function: _Function) -> list[Finding]:
    """Its import (the first finding) and its requirements, where it lists some."""
    if function.handler is None:
        return [Finding("handler", "ok", "none: /invoke takes and answers the model's tensors")]
    path, shown = function.handler
    try:
        module = import_handler(path, shown)
    except EdgeserveError as exc:
        imported = Finding.failed("handler", exc)
    else:
        hooks = [hook for hook in ("preprocess", "postprocess") if hasattr(module, hook)]
        defines = " and ".join(hooks) or "neither preprocess nor postprocess"
        imported = Finding("handler", "ok", f"{shown} imports; it defines {defines}")
    requirements = function.manifest.handler.requirements
    if not requirements:
        return [imported]
    return [imported, requirements_finding(requirements, unmet_requirements(requirements))]


def _samples(loaded: _Loaded) -> list[Finding]:
    """Start the runtime as serve does (its warm-up), then send each sample to its app."""
    bundle = loaded.bundle
    try:
        runtime = Runtime(bundle, loaded.engine, loaded.stats)
        app = create_app(runtime)
        plane = DataPlane(runtime)
        model = ModelInputs.from_server(plane.model_metadata(), plane.model_config())
        requests = sample_bodies(bundle.samples_dir, model, True) if bundle.samples_dir else []
    except EdgeserveError as exc:
        loaded.engine.backend.close()
        return [Finding.failed("warm-up", exc)]
    return asyncio.run(_run(app, runtime, requests))


async def _run(
    app: FunctionApp, runtime: Runtime, requests: list[tuple[Path, Body]]
) -> list[Finding]:
    """The runtime started and stopped as the app's lifespan does it, each request sent as
    a client would (with a token where the function wants one)."""
    auth = {}
    if app.credentials is not None:
        auth["Authorization"] = f"Bearer {app.credentials.tokens[0].decode()}"
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://doctor")
    try:
        async with serving(runtime), client:
            findings = [Finding("warm-up", "ok", f"ready in {_ms(runtime.timings['warmup_s'])}")]
            for path, body in requests:
                findings.append(await _send(client, path, body, auth))
    except EdgeserveError as exc:
        return [Finding.failed("warm-up", exc)]
    if not requests:
        findings.append(Finding("samples", "note", "none", NO_SAMPLES))
    return findings


async def _send(client: httpx.AsyncClient, path: Path, body: Body, auth: dict[str, str]) -> Finding:
    check = f"samples/{path.name}"
    route = "/invoke" if body.path == "/invoke" else "v2 infer"
    started = time.perf_counter()
    answer = await client.post(body.path, content=body.body, headers={**body.headers, **auth})
    took = _ms(time.perf_counter() - started)
    if answer.is_success:
        json = answer.headers.get("content-type", "").startswith("application/json")
        said = echo(answer.text) if json else f"{len(answer.content)} bytes of binary tensors"
        return Finding(check, "ok", f"{route}: {answer.status_code} in {took}: {said}")
    try:
        error = str(answer.json()["error"])
    except (ValueError, KeyError, TypeError):
        error = echo(answer.text)
    # a 4xx: the function refuses its own sample (build refuses one its handler does)
    kind = ConfigError if answer.status_code < 500 else EdgeserveError
    return Finding.failed(check, kind(f"{route}: {answer.status_code}: {error}"))


def _layout(function: _Function, loaded: _Loaded | None, backend: str) -> Finding:
    """The processes serve would start, as a bundle of the function plans them: the one
    loaded, else the first that can be written."""
    bundle = loaded.bundle if loaded else _first_bundle(function, backend)
    if bundle is None:
        return Finding.skipped("layout", "needs a bundle, which no backend could make")
    try:
        layout = plan_layout(bundle, None, backend)
    except EdgeserveError as exc:
        return Finding.failed("layout", exc)
    return Finding("layout", "ok", f"serve: {layout.reason}")


def _first_bundle(function: _Function, backend: str) -> Bundle | None:
    for name in dict.fromkeys((backend, *function.planned)):
        try:
            return function.bundle_for(name)
        except EdgeserveError:
            continue
    return None

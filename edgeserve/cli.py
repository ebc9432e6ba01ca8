"""The `edgeserve` command: parses arguments, calls the library, prints; errors become exit codes.

Each verb is one `_cmd_<verb>(args) -> int` function registered in `_parser()`. Heavy modules are
imported inside the command that needs them, so `edgeserve --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from edgeserve.errors import ConfigError, DeployError, EdgeserveError

if TYPE_CHECKING:
    from rich.table import Table

    from edgeserve.targets import TargetProfile
    from edgeserve.tune import TuneResult

console = Console()
err_console = Console(stderr=True)


def _cmd_init(args: argparse.Namespace) -> int:
    from edgeserve.scaffold import init_function

    path = init_function(Path(args.path))
    _say("created", "green", f"{path}  (next: edgeserve build {path})")
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from edgeserve.build import build
    from edgeserve.deploy import package_targets

    source = Path(args.source)
    out = Path(args.out) if args.out else Path("build") / source.resolve().name
    bundle = build(
        source,
        out,
        targets=tuple(args.target),
        archive=args.archive,
        report=lambda check: console.print(check.describe(), markup=False, soft_wrap=True),
    )
    name, digest = bundle.manifest.function.name, bundle.content_hash[:12]
    _say("built", "green", f"{name} -> {bundle.root}  hash {digest}")
    if not bundle.signature.batched:
        fixed = [spec.name for spec in bundle.signature.inputs + bundle.signature.outputs
                 if not spec.dims or spec.dims[0] != -1]  # fmt: skip
        _say(
            "batching off:", "yellow", f"{', '.join(fixed)} has no dynamic first dim, so every "
            "request runs alone (export the model with a dynamic batch axis to batch)",
        )  # fmt: skip
    for written in package_targets(bundle, args.target, out.parent / "dist", source):
        _say("packaged", "green", str(written))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from edgeserve.serve import serve

    if args.emulate == "aws-lambda":
        from edgeserve.emulate.aws_lambda import serve_lambda_emulator

        serve_lambda_emulator(
            Path(args.path), args.host, args.port, args.event, args.instances,
            target=args.target or "aws-lambda", log_level=args.log_level,
        )  # fmt: skip
        return 0
    serve(
        Path(args.path),
        host=args.host,
        port=args.port,
        backend=args.backend,
        log_level=args.log_level,
    )
    return 0


def _cmd_invoke(args: argparse.Namespace) -> int:
    from edgeserve.client import invoke

    body, content_type = _invoke_body(args)
    result = invoke(args.url, body, content_type, timeout_s=args.timeout)
    console.print_json(json.dumps(result)) if not isinstance(result, str) else _say("", "", result)
    return 0


def _invoke_body(args: argparse.Namespace) -> tuple[bytes, str]:
    if args.json is not None:
        return args.json.encode(), "application/json"
    if args.file is not None:
        path = Path(args.file)
        kinds = {
            ".png": "image/png",
            ".jpg": "image/jpeg",
            ".jpeg": "image/jpeg",
            ".json": "application/json",
        }
        return path.read_bytes(), kinds.get(path.suffix.lower(), "application/octet-stream")
    raise EdgeserveError("invoke needs --json TEXT or --file PATH")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rich.table import Table

    from edgeserve.backends import choose
    from edgeserve.hardware import describe, probe
    from edgeserve.manifest import BACKEND_NAMES

    platform = probe()
    choice = choose(platform, prefer=BACKEND_NAMES, override=args.backend)
    table = Table(title="edgeserve doctor", show_header=False)
    for key, value in describe(platform, choice):
        table.add_row(Text(key), Text(value))
    console.print(table)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from edgeserve.bench import bench, render_table, write_plot
    from edgeserve.bench.inputs import parse_shapes

    report = bench(
        args.target,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        window_s=args.window_s,
        max_windows=args.max_windows,
        protocol=args.protocol,
        inputs=args.inputs,
        shapes=parse_shapes(args.shape),
        batch_size=args.batch_size,
        model=args.model,
        ready_timeout_s=args.ready_timeout,
    )
    out = err_console if args.json == "-" else console
    out.print(render_table(report))
    for note in report.warnings:
        _say("warning:", "yellow", note, out)
    if args.json:
        text = json.dumps(report.to_json(), indent=2) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text, encoding="utf-8")
    if args.plot != "":
        plot = write_plot(report, Path(args.plot or f"bench-{report.model}.png"))
        _say("plot:", "", str(plot), out)
    return 0


def _cmd_deploy(args: argparse.Namespace) -> int:
    from edgeserve.bundle import open_or_build
    from edgeserve.deploy import driver_for

    profile = _target_profile(args)
    bundle = open_or_build(Path(args.path), targets=(args.target,))  # the profile as given
    result = driver_for(profile).deploy(bundle, profile)
    where = f" at {result.url}" if result.url else ""
    _say("deployed", "green", f"{result.name} {result.version} to {result.target}{where}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from edgeserve.deploy import driver_for

    profile = _target_profile(args)
    report = driver_for(profile).status(_function_name(args.path), profile)
    console.print_json(json.dumps(report))
    unreachable = [
        key for key, part in report.items() if isinstance(part, dict) and "error" in part
    ]
    if unreachable:
        _say("error:", "red", f"no status from {', '.join(unreachable)} (see `error`)", err_console)
        return DeployError.exit_code
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from edgeserve.deploy import driver_for

    profile = _target_profile(args)
    result = driver_for(profile).rollback(_function_name(args.path), profile)
    _say("rolled back", "green", f"{result.name} on {result.target} to {result.version}")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from edgeserve.deploy import driver_for

    profile = _target_profile(args)
    stop = getattr(driver_for(profile), "stop", None)
    if stop is None:
        raise ConfigError(f"target {profile.name!r} (driver {profile.driver}) has no `stop`")
    stop(_function_name(args.path), profile)
    _say("stopped", "green", f"{_function_name(args.path)} on {profile.name}")
    return 0


def _target_profile(args: argparse.Namespace) -> TargetProfile:
    """The `--target` profile, narrowed to the `--host` devices (jetson) when given."""
    from edgeserve.targets import load_target

    path = Path(args.path)
    profile = load_target(args.target, path if path.is_dir() else path.parent)
    if not args.host:
        return profile
    if profile.driver != "jetson":
        raise ConfigError(f"--host applies to jetson targets; {args.target} is {profile.driver}")
    from edgeserve.deploy.jetson import with_hosts

    return with_hosts(profile, tuple(args.host))


def _function_name(path: str) -> str:
    """The function a source folder or bundle holds (a bare name is taken as is)."""
    from edgeserve.bundle import BUNDLE_FILE, Bundle
    from edgeserve.manifest import MANIFEST_NAME, load_manifest

    folder = Path(path)
    if (folder / BUNDLE_FILE).is_file():
        return Bundle.open(folder).name
    if (folder / MANIFEST_NAME).is_file():
        return load_manifest(folder).function.name
    return path


def _cmd_engine(args: argparse.Namespace) -> int:
    from edgeserve.backends.tensorrt import engine_cache_dir
    from edgeserve.bundle import Bundle
    from edgeserve.runtime import Runtime

    # Loading on TensorRT builds the engine with the shape profile serving will use (so the
    # cache key matches) and caches it; later loads of any release of this model reuse it.
    runtime = Runtime.load(Bundle.open(Path(args.bundle)), backend="tensorrt")
    took = runtime.timings["load_s"]
    _say("engine ready", "green", f"for {runtime.name} in {took:.1f}s: {engine_cache_dir()}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from edgeserve.tune import candidates, tune

    grid = candidates(args.max_batch, args.delay_ms, args.instances, args.preferred.split(","))
    result = tune(
        Path(args.source),
        budget_ms=args.latency_budget_ms,
        grid=grid,
        concurrency=args.concurrency,
        window_s=args.window_s,
        write=not args.dry_run,
    )
    console.print(_tune_table(result, args.concurrency))
    if result.best is None:
        raise EdgeserveError("tune: no candidate kept p99 within the budget; raise it or lower c")
    where = f"written to {result.written}" if result.written else "not written (--dry-run)"
    _say("best:", "", f"{result.best.candidate.settings()}  {where}")
    return 0


def _tune_table(result: TuneResult, concurrency: int) -> Table:
    from rich.table import Table

    title = f"edgeserve tune: c={concurrency}, p99 budget {result.budget_ms:g} ms"
    table = Table(title=title)
    for column in ("max_batch", "preferred", "delay ms", "instances", "items/s", "p99 ms", ""):
        table.add_column(column, justify="right")
    for trial in result.trials:
        c = trial.candidate
        over = "over" if trial.p99_ms > result.budget_ms else ""
        mark = "failed" if trial.errors else "chosen" if trial is result.best else over
        table.add_row(
            str(c.max_batch_size), str(list(c.preferred_batch_sizes) or "-"),
            f"{c.max_queue_delay_ms:g}", str(c.instances),
            f"{trial.items_per_s:.0f}", f"{trial.p99_ms:.1f}",
            Text(mark, style="green" if mark == "chosen" else ""),
        )  # fmt: skip
    return table


def _numbers(kind: Callable[[str], float]) -> Callable[[str], list[float]]:
    """An argparse type for comma lists: `1,4,16` -> [1, 4, 16]."""

    def parse(text: str) -> list[float]:
        return [kind(part) for part in text.split(",") if part.strip()]

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgeserve", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help_, description=help_)
        sub.set_defaults(func=func)
        return sub

    p = add("init", _cmd_init, "scaffold a working function from templates")
    p.add_argument("path")

    p = add("build", _cmd_build, "build a function source folder into a bundle")
    p.add_argument("source")
    p.add_argument("--out", help="bundle folder (default build/<name>)")
    p.add_argument("--target", action="append", default=[], help="target profile(s) to plan for")
    p.add_argument("--archive", action="store_true", help="also write dist/ archives per target")

    p = add("serve", _cmd_serve, "serve a bundle or a function source folder over HTTP")
    p.add_argument("path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--backend", choices=["tensorrt", "openvino", "onnxruntime"])
    p.add_argument("--log-level", default="info")
    p.add_argument("--emulate", choices=["aws-lambda"], help="run it the way this target runs it")
    p.add_argument(
        "--event",
        default="url",
        choices=["url", "http", "rest", "alb"],
        help="--emulate aws-lambda: the event source (Function URL by default)",
    )
    p.add_argument("--instances", type=int, default=1, help="--emulate: execution environments")
    p.add_argument("--target", help="--emulate: target profile giving memory and timeout")

    p = add("invoke", _cmd_invoke, "send one request to a function's /invoke")
    p.add_argument("url")
    p.add_argument("--json", help="a JSON payload")
    p.add_argument("--file", help="a file to send (PNG/JPEG/JSON/bytes)")
    p.add_argument("--timeout", type=float, default=60.0)

    p = add(
        "bench", _cmd_bench, "measure a function's latency and throughput (perf_analyzer-style)"
    )
    p.add_argument("target", help="function source folder, bundle, or http:// URL")
    p.add_argument(
        "--concurrency", type=_numbers(int), default=[], help="closed-loop levels: 1,4,16"
    )
    p.add_argument(
        "--request-rate", type=_numbers(float), default=[], help="Poisson rates/s: 100,200"
    )
    p.add_argument("--window-s", type=float, default=2.0, help="measurement window (default 2 s)")
    p.add_argument("--max-windows", type=int, default=10, help="windows before a level is unstable")
    p.add_argument("--protocol", choices=["binary", "json"], default="binary")
    p.add_argument(
        "--inputs", help="a samples folder, or 'random' (default: the function's samples)"
    )
    p.add_argument("--shape", action="append", default=[], help="NAME:D1,D2 for dynamic dims")
    p.add_argument("--batch-size", type=int, default=1, help="rows per synthesized request")
    p.add_argument("--model", help="model name (default: the function's, or the server's only one)")
    p.add_argument(
        "--json", nargs="?", const="-", help="write the report as JSON to FILE (or stdout)"
    )
    p.add_argument("--plot", help="PNG path (default bench-<model>.png; '' for none)")
    p.add_argument(
        "--ready-timeout", type=float, default=120.0, help="seconds to wait for the server"
    )

    for verb, func, help_ in (
        ("deploy", _cmd_deploy, "ship to a target, health-check it, roll back on failure"),
        ("status", _cmd_status, "what runs on a target: version, health, backend (per host)"),
        ("rollback", _cmd_rollback, "switch a target back to the release before the current one"),
        ("stop", _cmd_stop, "stop a function's service on a target (its releases stay)"),
    ):
        p = add(verb, func, help_)
        p.add_argument("path", help="function source folder or bundle (status/rollback: or name)")
        p.add_argument("--target", required=True, help="target profile name or .toml path")
        p.add_argument("--host", action="append", default=[], help="jetson: only this host/group")

    p = add("engine", _cmd_engine, "on a device: build and cache a bundle's TensorRT engine")
    p.add_argument("action", choices=["build"])
    p.add_argument("bundle")

    p = add("tune", _cmd_tune, "sweep batching settings against a p99 budget; write the best")
    p.add_argument("source", help="function source folder (its function.toml is updated)")
    p.add_argument("--latency-budget-ms", type=float, required=True, help="p99 to stay within")
    p.add_argument("--concurrency", type=int, default=8, help="closed-loop clients (default 8)")
    p.add_argument("--max-batch", type=_numbers(int), default=[8, 32], help="e.g. 8,32")
    p.add_argument("--delay-ms", type=_numbers(float), default=[0, 2, 8], help="e.g. 0,2,8")
    p.add_argument("--instances", type=_numbers(int), default=[1, 2], help="e.g. 1,2")
    p.add_argument("--preferred", default="none,pow2", help="preferred sizes: none, pow2")
    p.add_argument("--window-s", type=float, default=1.0, help="measurement window (default 1 s)")
    p.add_argument("--dry-run", action="store_true", help="show the table, leave the manifest")

    p = add("doctor", _cmd_doctor, "show the hardware, the backends found, and the choice")
    p.add_argument("--backend", choices=["tensorrt", "openvino", "onnxruntime"])
    return parser


def _say(label: str, style: str, text: str, out: Console = console) -> None:
    """`label` in its colour, then `text` as plain text: never read as markup, so brackets in
    a path, an rsync message or a device's error print as they are."""
    line = Text.assemble((label, style), " ", text) if label else Text(text)
    out.print(line, highlight=False, soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except EdgeserveError as exc:
        _say("error:", "red", exc.message, err_console)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `edgeserve` command: parses arguments, calls the library, prints; errors become exit codes.

Each verb is one `_cmd_<verb>(args) -> int` function, listed in `COMMANDS` (those acting on a
deployed function in `targetcommands.py`); its options and help live in `arguments.py`. Heavy
modules are imported inside the command that needs them, so `edgeserve --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edgeserve.arguments import TIMEOUTS, parser
from edgeserve.commandline import parse
from edgeserve.errors import ConfigError, EdgeserveError
from edgeserve.printed import console, err_console, say
from edgeserve.progress import live_log, progress_display, warnings_shown
from edgeserve.targetcommands import deploy_command, rollback_command, status_command, stop_command

if TYPE_CHECKING:
    from edgeserve.bench import Level


def _cmd_init(args: argparse.Namespace) -> int:
    from edgeserve.scaffold import init_function, next_steps, suggested_port

    # the batch-axis check runs the model: seconds; one that cannot run is a warning
    with live_log(err_console, "init"), warnings_shown(err_console):
        path = init_function(Path(args.path), model=Path(args.model) if args.model else None)
    say("created", "green", next_steps(path, port=suggested_port()))
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from edgeserve.builder import build
    from edgeserve.signature import unbatchable
    from edgeserve.targets import package_targets

    source = Path(args.source)
    out = Path(args.out) if args.out else Path("build") / source.resolve().name
    bundle = build(
        source,
        out,
        targets=tuple(args.target),
        archive=args.archive,
        report=lambda step: console.print(step.describe(), markup=False, soft_wrap=True),
    )
    name, digest = bundle.manifest.function.name, bundle.content_hash[:12]
    if modules := bundle.handler_modules:  # the modules of its folder the handler imports
        handler = f"{bundle.manifest.handler.module}.py with {', '.join(modules)}"
        console.print(f"handler: {handler}", markup=False, soft_wrap=True)
    say("built", "green", f"{name} -> {bundle.root}  hash {digest}")
    if not bundle.signature.batched:
        say(
            "batching off:", "yellow", f"no batch axis ({unbatchable(bundle.signature)}), so "
            "every request runs alone (export the model with a dynamic batch axis to batch)",
        )  # fmt: skip
    with live_log(err_console, "packaging"):  # pip's downloads, live on a terminal
        packaged = package_targets(bundle, args.target, out.parent / "dist", source)
    for written in packaged:
        say("packaged", "green", str(written))
        if (report := written.parent / "image.txt").is_file():  # an image's size per layer
            console.print(report.read_text(encoding="utf-8"), markup=False, end="", soft_wrap=True)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from edgeserve.http.cors import ORIGINS_ENV
    from edgeserve.logformat import LOG_FORMAT_ENV
    from edgeserve.server import serve

    emulator_only = {
        "--event": args.event != "url",
        "--instances": args.instances != 1,
        "--target": args.target is not None,
    }
    if args.emulate is None and any(emulator_only.values()):  # else silently ignored
        given = ", ".join(flag for flag, value in emulator_only.items() if value)
        raise ConfigError(f"{given}: only with --emulate aws-lambda")
    if args.cors_origin:  # read where the app is made: every front, each Lambda environment
        os.environ[ORIGINS_ENV] = ",".join(args.cors_origin)
    if args.log_format:  # read where each process sets up its logging
        os.environ[LOG_FORMAT_ENV] = args.log_format
    if args.emulate == "aws-lambda":
        from edgeserve.aws_lambda.emulator import serve_lambda_emulator

        serve_lambda_emulator(
            Path(args.path), args.host, 8080 if args.port is None else args.port, args.event,
            args.instances,
            target=args.target or "aws-lambda", log_level=args.log_level,
        )  # fmt: skip
        return 0
    from edgeserve.http.auth import TOKEN_FILE_ENV
    from edgeserve.http.tls import TlsFiles

    if args.auth_token_file:
        os.environ[TOKEN_FILE_ENV] = args.auth_token_file  # read where the app is made
    tls = TlsFiles.resolve(args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs, os.environ)
    return serve(
        Path(args.path),
        host=args.host,
        port=args.port,
        backend=args.backend,
        log_level=args.log_level,
        tls=tls,
        timeouts={f"{name}_s": getattr(args, f"{name}_timeout") for name in TIMEOUTS},
        workers=args.workers,
        grpc_port=args.grpc_port,
    )


def _cmd_invoke(args: argparse.Namespace) -> int:
    from edgeserve.answers import show
    from edgeserve.client import invoke, request_body

    if args.payload is not None:
        raise ConfigError(
            f"invoke: unexpected argument {args.payload!r} after the URL; expected the payload "
            f"as --json TEXT or --file PATH. Hint: edgeserve invoke {args.url} --json "
            f"{shlex.quote(args.payload)}"
        )
    body, content_type = request_body(args.json, args.file)
    result = invoke(args.url, body, content_type, timeout_s=args.timeout, headers=args.header)
    show(result, console, whole=args.full)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from edgeserve.doctor import machine_table, render

    table, refused = machine_table(args.backend)
    console.print(table)
    if args.function is None and refused is not None:
        raise refused
    if args.function is None:
        return 0
    from edgeserve.examination import examine

    report = examine(Path(args.function), backend=args.backend, timeout_s=args.load_timeout)
    console.print(render(report))
    if report.problems:
        say("error:", "red", report.summary(), err_console)
    return report.exit_code


def _cmd_bench(args: argparse.Namespace) -> int:
    from edgeserve.bench import bench, render_table, write_plot
    from edgeserve.bench.inputs import parse_shapes

    levels = len(args.concurrency) + len(args.request_rate) or 1
    with progress_display(err_console) as progress:
        task = progress.add_task("bench: starting the server", total=levels)
        started: list[str] = []

        def on_level(level: Level) -> None:
            started.append(level.label)
            progress.update(task, completed=len(started) - 1, description=f"bench {level.label}")

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
            on_level=on_level,
            processes=args.processes,
            headers=args.header,
        )
    out = err_console if args.json == "-" else console
    out.print(render_table(report))
    for note in report.warnings:
        say("warning:", "yellow", note, out)
    if args.json:
        text = json.dumps(report.to_json(), indent=2) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text, encoding="utf-8")
    if args.plot != "":
        plot = write_plot(report, Path(args.plot or f"bench-{report.model}.png"))
        say("plot:", "", str(plot), out)
    if report.failures:
        raise EdgeserveError("bench: requests failed\n" + "\n".join(report.failures))
    return 0


def _cmd_engine(args: argparse.Namespace) -> int:
    from edgeserve.backends.tensorrt import engine_cache_dir
    from edgeserve.bundle import Bundle
    from edgeserve.runtime import Runtime

    # Loading on TensorRT builds the engine with the shape profile serving will use (so the
    # cache key matches) and caches it; later loads of any release of this model reuse it.
    runtime = Runtime.load(Bundle.open(Path(args.bundle)), backend="tensorrt")
    took = runtime.timings["load_s"]
    say("engine ready", "green", f"for {runtime.name} in {took:.1f}s: {engine_cache_dir()}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from edgeserve.tune import (
        Candidate,
        candidates,
        failure_reason,
        render_table,
        tune,
        unbatchable_model,
    )

    per_device = args.processes_per_device or [None]
    fixed = unbatchable_model(Path(args.source))
    grid = candidates(
        args.max_batch, args.delay_ms, args.instances, args.preferred.split(","), per_device,
        batched=not fixed,
    )  # fmt: skip
    if fixed:
        say(
            "no batching:", "yellow", f"no batch axis ({fixed}), so the model cannot batch; "
            "tune sweeps instances alone and writes no batch size",
        )  # fmt: skip
    with progress_display(err_console) as progress:
        task = progress.add_task("tune", total=len(grid))

        def on_trial(index: int, candidate: Candidate) -> None:
            settings = (
                f"max_batch {candidate.max_batch_size}, delay {candidate.max_queue_delay_ms:g} ms"
                if candidate.max_batch_size
                else f"instances {candidate.instances}"
            )
            if candidate.processes_per_device:
                settings += f", {candidate.processes_per_device} per device"
            progress.update(task, completed=index, description=f"tune: {settings}")

        result = tune(
            Path(args.source),
            budget_ms=args.latency_budget_ms,
            grid=grid,
            concurrency=args.concurrency,
            window_s=args.window_s,
            write=not args.dry_run,
            on_trial=on_trial,
        )
    console.print(render_table(result, args.concurrency))
    for trial in result.trials:
        if trial.errors:
            settings = trial.candidate.describe()
            console.print(f"failed: {settings}: {trial.failure}", markup=False, soft_wrap=True)
    if result.best is None:
        raise EdgeserveError(failure_reason(result))
    where = f"written to {result.written}" if result.written else "not written (--dry-run)"
    measured = f" (on the {result.best.kind})" if result.best.candidate.processes_per_device else ""
    say("best:", "", f"{result.best.candidate.describe()}{measured}  {where}")
    return 0


def _cmd_help(args: argparse.Namespace) -> int:
    from importlib.resources import files

    from rich.markdown import Markdown

    page = files("edgeserve").joinpath("reference", f"{args.topic}.md").read_text(encoding="utf-8")
    if console.is_terminal:
        console.print(Markdown(page))
    else:
        sys.stdout.write(page)  # as written: for a pager, grep or a file
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from rich.table import Table

    from edgeserve import cache

    if args.action == "prune":
        bounds = cache.Bounds.from_env()
        keep = bounds.max_bundles if args.keep is None else args.keep
        limit = bounds.max_mb if args.max_mb is None else args.max_mb
        removed = cache.prune(cache.Bounds(keep, limit))
        freed = sum(entry.size_bytes for entry in removed) / 2**20
        say("removed", "", f"{len(removed)} bundles ({freed:.1f} MB) from {cache.bundles_dir()}")
        return 0
    found = cache.entries()
    say("", "", f"{len(found)} bundles in {cache.bundles_dir()}")
    table = Table()
    for column in ("bundle", "MB", "last used"):
        table.add_column(column, justify="left" if column == "bundle" else "right")
    for entry in found:
        table.add_row(entry.name, f"{entry.size_bytes / 2**20:.1f}", cache.ago(entry.last_used))
    console.print(table)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "init": _cmd_init,
    "build": _cmd_build,
    "serve": _cmd_serve,
    "invoke": _cmd_invoke,
    "bench": _cmd_bench,
    "engine": _cmd_engine,
    "tune": _cmd_tune,
    "help": _cmd_help,
    "cache": _cmd_cache,
    "doctor": _cmd_doctor,
    "deploy": deploy_command,
    "status": status_command,
    "rollback": rollback_command,
    "stop": stop_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(parser(COMMANDS), argv)
    try:
        return int(args.func(args))
    except EdgeserveError as exc:
        say("error:", "red", exc.message, err_console)  # plain text, brackets and all
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

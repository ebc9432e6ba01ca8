"""The `edgeserve` command line: verbs, options and the help users read (units, defaults).

Only the grammar lives here: cli.py holds what each verb does and hands its functions in, so
`edgeserve --help` builds this parser without importing any command's module.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from edgeserve import __version__, argtypes
from edgeserve.cache import DEFAULT_MAX_BUNDLES, DEFAULT_MAX_MB
from edgeserve.commandline import Parser
from edgeserve.logformat import LOG_FORMATS

Command = Callable[[argparse.Namespace], int]

LOAD_TIMEOUT_S = 120.0
"""`doctor FUNCTION --load-timeout`'s default: a CPU backend loads a model in seconds; TensorRT
building an engine may take minutes (`edgeserve engine build` first, or a longer bound)."""

MIN_WINDOWS = 3
"""`bench --max-windows` at least: a level is stable when its last 3 windows agree
(bench.measure.STABILITY_WINDOWS, not imported here: `--help` stays light; a test holds the
two equal)."""


DESCRIPTION = """\
edgeserve puts one ONNX model into production as a self-contained HTTP function: a micro-batcher
and the backend that fits the machine (OpenVINO, ONNX Runtime, TensorRT), served locally, on a
Jetson or on AWS Lambda. Start here:

  edgeserve init myfunc --model model.onnx   adopt a model (or `edgeserve init myfunc` for a demo)
  edgeserve serve myfunc                     build it and serve it on 127.0.0.1:8080
  edgeserve invoke 127.0.0.1:8080 --file myfunc/samples/request.json
  open http://127.0.0.1:8080/docs            the function's API, with its tensors

`edgeserve COMMAND --help` describes each command; `edgeserve help manifest` explains
function.toml."""

_SHIPPED_TARGETS = ", ".join(
    sorted(path.stem for path in (Path(__file__).parent / "templates" / "targets").glob("*.toml"))
)
"""The target profiles edgeserve ships (profiles.SHIPPED_DIR), for the help texts."""
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


class _BackendNames:
    """argparse choices for --backend: the backend names of the function.toml schema, read only
    when a command's help or its --backend value needs them (`edgeserve --help` stays light)."""

    def __iter__(self) -> Iterator[str]:
        from edgeserve.manifest import BACKEND_NAMES

        return iter(BACKEND_NAMES)

    def __contains__(self, name: object) -> bool:
        return name in list(self)


BACKENDS = _BackendNames()
TIMEOUTS = {
    "header": "seconds a client has to send a request's headers (then 408)",
    "body": "seconds a client has to send a request's body, from its headers (then 408)",
    "idle": "seconds a kept-alive connection may wait for its next request",
    "drain": "on SIGTERM, seconds to finish what is in flight; the rest gets 503, then exit",
}


def _header_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-H",
        "--header",
        type=argtypes.header,
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="send this header with every request, repeatable: 'Authorization: Bearer TOKEN' "
        "for a function with auth on",
    )


def parser(commands: Mapping[str, Command]) -> argparse.ArgumentParser:
    """The `edgeserve` parser; each verb runs `commands[verb]` (set as `func`)."""
    parser = Parser(
        prog="edgeserve", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"edgeserve {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help_, description=help_)
        sub.set_defaults(func=commands[name])
        return sub

    p = add("init", "start a function: adopt your ONNX model, or scaffold a demo MLP")
    p.add_argument("path", help="the new function folder (empty, new, or holding only a model)")
    p.add_argument(
        "--model",
        help="an ONNX model to adopt, with a manifest and samples (/invoke, v2) that fit its "
        "inputs (default: the demo MLP, or the one .onnx already in PATH)",
    )

    p = add("build", "build a function source folder into a bundle")
    p.add_argument("source", help="function source folder (holding function.toml)")
    p.add_argument("--out", help="bundle folder (default: build/<folder name>)")
    p.add_argument(
        "--target",
        action="append",
        default=[],
        help=f"target profile to plan for, repeatable: {_SHIPPED_TARGETS}, or a .toml (default: "
        "local); a deploy target's package is written too: what deploy would ship, not shipped",
    )
    p.add_argument("--archive", action="store_true", help="also write dist/ archives per target")

    p = add("serve", "serve a bundle or a function source folder over HTTP")
    p.add_argument("path", help="bundle folder or archive, or function source folder")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all)"
    )
    p.add_argument(
        "--port",
        type=argtypes.port,
        help="TCP port, 1-65535, 0 for any free one (default: [resources] port, else 8080)",
    )
    p.add_argument(
        "--grpc-port",
        type=argtypes.port,
        help="also serve KServe v2 over gRPC (Triton's protocol: tritonclient.grpc, "
        "perf_analyzer -i grpc) on this port, same host; Triton's is 8001, 0: any free one "
        "(default: [resources] grpc_port, else no gRPC; needs pip install 'edgeserve[grpc]')",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        help="force a backend (default: the best one this machine has; see `edgeserve doctor`)",
    )
    p.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="server log detail (default info)"
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="ISO8601: each log line starts with its UTC time, as Triton's --log-format "
        "(default: $EDGESERVE_LOG_FORMAT, else `LEVEL: text`)",
    )
    p.add_argument(
        "--workers",
        help="front processes: a count or `auto` (default: EDGESERVE_WORKERS, else the "
        "manifest's [resources] workers); they feed one inference process per device "
        "([resources] devices, processes_per_device); 1, on one device, serves in one process",
    )
    for name, what in TIMEOUTS.items():
        p.add_argument(
            f"--{name}-timeout",
            type=argtypes.seconds,
            metavar="S",
            help=f"{what} (default: [resources] {name}_timeout_s)",
        )
    p.add_argument("--emulate", choices=["aws-lambda"], help="run it the way this target runs it")
    p.add_argument(
        "--event",
        default="url",
        choices=["url", "http", "rest", "alb"],
        help="--emulate aws-lambda: the event source (default url: a Function URL)",
    )
    p.add_argument(
        "--instances",
        type=argtypes.count,
        default=1,
        help="--emulate: execution environments (default 1)",
    )
    p.add_argument(
        "--target", help="--emulate: target profile giving memory, timeout and environment"
    )
    p.add_argument("--ssl-certfile", help="serve HTTPS with this PEM certificate (chain)")
    p.add_argument("--ssl-keyfile", help="the PEM private key of --ssl-certfile")
    p.add_argument("--ssl-ca-certs", help="require client certificates signed by this CA (mTLS)")
    p.add_argument(
        "--auth-token-file",
        help="require `Authorization: Bearer <token>` with a token from this file (one a line; "
        "default: $EDGESERVE_AUTH_TOKEN[_FILE], else no auth)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages of this origin call the function from a browser (CORS), "
        "repeatable: https://app.example.com, or '*' for any page (default: "
        "$EDGESERVE_CORS_ORIGINS, else the manifest's [cors] origins, else none)",
    )

    p = add(
        "invoke",
        "send one request to a function's /invoke (a KServe v2 infer request: to its v2 route) "
        "and print the answer",
    )
    p.add_argument(
        "url", help="where the function runs: http://HOST:PORT, or HOST:PORT (http is assumed)"
    )
    # a payload where the URL ends: refused with a hint (argparse said "unrecognized arguments")
    p.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--json", help="a JSON payload, as text")
    p.add_argument("--file", help="a file to send (PNG/JPEG/JSON by extension, else raw bytes)")
    p.add_argument("--full", action="store_true", help="the whole answer, as JSON (rows uncut)")
    p.add_argument(
        "--timeout",
        type=argtypes.seconds,
        default=60.0,
        help="seconds to wait for the answer (default 60)",
    )
    _header_option(p)

    p = add("bench", "measure a function's latency and throughput (perf_analyzer-style)")
    p.add_argument("target", help="function source folder, bundle, or server (HOST:PORT, URL)")
    _header_option(p)
    p.add_argument(
        "--concurrency",
        type=argtypes.numbers(int),
        default=[],
        help="closed-loop levels, comma-separated: 1,4,16 (default 1 when no --request-rate)",
    )
    p.add_argument(
        "--request-rate",
        type=argtypes.numbers(float),
        default=[],
        help="open-loop Poisson rates, requests/s: 100,200",
    )
    p.add_argument(
        "--window-s",
        type=argtypes.seconds,
        default=2.0,
        help="measurement window, seconds (default 2)",
    )
    p.add_argument(
        "--max-windows",
        type=argtypes.at_least(
            MIN_WINDOWS, f" (a level is stable when its last {MIN_WINDOWS} agree)"
        ),
        default=10,
        help=f"windows before a level counts as unstable, at least {MIN_WINDOWS}: a level is "
        f"stable when its last {MIN_WINDOWS} windows agree (default 10)",
    )
    p.add_argument(
        "--protocol",
        choices=["binary", "json"],
        default="binary",
        help="v2 tensors as Triton's binary extension or JSON (default binary)",
    )
    p.add_argument(
        "--inputs", help="a samples folder, or 'random' (default: the function's samples/)"
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        help="NAME:D1,D2 for a random input's dynamic dims, batch excluded (default 16 each)",
    )
    p.add_argument(
        "--batch-size", type=argtypes.count, default=1, help="rows per random request (default 1)"
    )
    p.add_argument("--model", help="model name (default: the function's, or the server's only one)")
    p.add_argument(
        "--json", nargs="?", const="-", help="write the report as JSON to FILE (or to stdout)"
    )
    p.add_argument("--plot", help="PNG path (default bench-<model>.png; '' for none)")
    p.add_argument(
        "--ready-timeout",
        type=argtypes.seconds,
        default=120.0,
        help="seconds to wait for the server to be ready (default 120)",
    )
    p.add_argument(
        "--processes",
        type=argtypes.count,
        default=1,
        help="load-generator processes (one drives ~20,000 requests/s per core)",
    )

    for verb, help_ in (
        ("deploy", "ship to a target, health-check it, roll back on failure"),
        ("status", "what runs on a target: version, health, backend (per host)"),
        ("rollback", "switch a target back to the release before the current one"),
        ("stop", "stop a function's service on a target (its releases stay)"),
    ):
        p = add(verb, help_)
        p.add_argument("path", help="function source folder or bundle (status/rollback: or name)")
        p.add_argument(
            "--target",
            required=True,
            help=f"target profile: {_SHIPPED_TARGETS}, or a .toml path (`edgeserve build "
            "--target T` writes what deploy would ship, without shipping it)",
        )
        p.add_argument(
            "--host",
            action="append",
            default=[],
            help="jetson: only this host or group, repeatable (default: all)",
        )

    p = add("engine", "on a device: build and cache a bundle's TensorRT engine")
    p.add_argument("action", choices=["build"], help="what to do (build)")
    p.add_argument("bundle", help="bundle folder")

    p = add("tune", "sweep batching settings against a p99 budget; write the best")
    p.add_argument("source", help="function source folder (its function.toml is updated)")
    p.add_argument(
        "--latency-budget-ms", type=float, required=True, help="p99 latency to stay within, ms"
    )
    p.add_argument("--concurrency", type=int, default=8, help="closed-loop clients (default 8)")
    p.add_argument(
        "--max-batch",
        type=argtypes.numbers(int),
        default=[8, 32],
        help="sizes to try (default 8,32)",
    )
    p.add_argument(
        "--delay-ms",
        type=argtypes.numbers(float),
        default=[0, 2, 8],
        help="max queue delays to try, ms (default 0,2,8)",
    )
    p.add_argument(
        "--instances",
        type=argtypes.numbers(int),
        default=[1, 2],
        help="instances to try (default 1,2)",
    )
    p.add_argument(
        "--processes-per-device",
        type=argtypes.numbers(int),
        help="inference processes per device to try, e.g. 1,2 (default: the manifest's)",
    )
    p.add_argument(
        "--preferred",
        default="none,pow2",
        help="preferred sizes to try: none, pow2 (default none,pow2)",
    )
    p.add_argument(
        "--window-s", type=float, default=1.0, help="measurement window, seconds (default 1)"
    )
    p.add_argument("--dry-run", action="store_true", help="show the table, leave the manifest")

    p = add("help", "reference pages that ship with edgeserve: manifest")
    p.add_argument(
        "topic", nargs="?", default="manifest", choices=["manifest"], help="function.toml's keys"
    )

    p = add(
        "cache",
        "list or prune the bundles `serve`, `bench` and `deploy` build from source folders",
    )
    p.add_argument("action", choices=["list", "prune"], help="list the bundles, or prune them")
    p.add_argument(
        "--keep",
        type=int,
        help="prune: bundles to keep, most recently used first "
        f"(default $EDGESERVE_CACHE_MAX_BUNDLES, else {DEFAULT_MAX_BUNDLES}; 0 empties it)",
    )
    p.add_argument(
        "--max-mb",
        type=float,
        help="prune: megabytes to keep in all "
        f"(default $EDGESERVE_CACHE_MAX_MB, else {DEFAULT_MAX_MB:g})",
    )

    p = add(
        "doctor",
        "show the hardware, the backends found and the choice; given a function, what serving "
        "it here would do and what is wrong with it",
    )
    p.add_argument(
        "function",
        nargs="?",
        help="a function source folder, a bundle (folder or archive) or a model.onnx alone: "
        "its manifest, model, build, backend (loaded for real), handler, samples and layout",
    )
    p.add_argument("--backend", choices=BACKENDS, help="see what forcing this backend would do")
    p.add_argument(
        "--load-timeout",
        type=argtypes.seconds,
        default=LOAD_TIMEOUT_S,
        metavar="S",
        help="with a function: seconds loading the model on a backend may take before it is "
        f"reported as a failure (default {LOAD_TIMEOUT_S:g})",
    )
    return parser

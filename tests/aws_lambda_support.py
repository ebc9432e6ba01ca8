"""Shared by the tests/test_aws_lambda_*.py files: a real small bundle, a local wheelhouse, moto."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from tests.models import mlp_model
from tests.server import Server, running

FUNCTION_TOML = """\
[function]
name = "{name}"
version = "1"

[batching]
max_batch_size = 8
max_queue_delay_ms = 5
"""


def small_bundle(
    tmp: Path,
    name: str = "tiny",
    handler: str | None = None,
    modules: dict[str, str] | None = None,
    width: int = 4,
) -> Bundle:
    """A real bundle for target aws-lambda: an MLP x[N,16] -> y[N,width], optional handler.py
    and files beside it (`modules`: relative path -> text)."""
    source = tmp / "src" / name
    source.mkdir(parents=True)
    mlp_model(source / "model.onnx", n_out=width)
    toml = FUNCTION_TOML.format(name=name)
    if handler is not None:
        (source / "handler.py").write_text(handler)
        toml += '\n[handler]\nmodule = "handler"\n'
    for path, text in (modules or {}).items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_text(text)
    (source / "function.toml").write_text(toml)
    return build(source, tmp / "build" / name, targets=("aws-lambda",))


def wheelhouse(
    tmp: Path, name: str = "tinydep", version: str = "1.0", payload: bytes = b""
) -> Path:
    """A folder holding one pure-Python wheel (with `payload` as a data file), so packaging runs
    offline and fast."""
    folder = tmp / "wheelhouse"
    folder.mkdir(exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    wheel_info = "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{name}/payload.bin": payload,
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": wheel_info.encode(),
    }
    record = "".join(f"{path},sha256={_digest(data)},{len(data)}\n" for path, data in files.items())
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
        wheel.writestr(f"{dist_info}/RECORD", record + f"{dist_info}/RECORD,,\n")
    return folder


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """A real AWS API endpoint (moto, server mode) on 127.0.0.1; yields its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    httpx.post(
        f"{url}/moto-api/reset", timeout=10
    ).raise_for_status()  # moto's state is per process
    try:
        yield url
    finally:
        server.stop()


ROLE = "arn:aws:iam::123456789012:role/edgeserve-lambda"
TRUST = {  # the trust policy a Lambda execution role carries
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "lambda.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def write_profile(path: Path, settings: str) -> Path:
    path.write_text(f'driver = "aws-lambda"\n\n[settings]\n{settings}')
    return path


def environ_without_aws() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}


HANDLER = '''\
"""Test handler: PNG (4x4 gray) -> one row; msgpack/JSON {"rows": [...]} -> one row each.

`sleep_s` stalls (timeout tests), `hold_s` stalls holding the GIL, so that the event loop
cannot run either (as a C call that keeps the GIL does), `allocate_mb` grows the process
(memory tests) and `pad_bytes` pads the response (response-size tests)."""
import io
import os
import sys
import time

import numpy as np


def preprocess(payload, ctx):
    if isinstance(payload, bytes):
        from PIL import Image

        pixels = np.asarray(Image.open(io.BytesIO(payload)).convert("L"), dtype=np.float32)
        return [{"x": pixels.reshape(16) / 255.0}]
    time.sleep(payload.get("sleep_s", 0))
    if held := payload.get("hold_s", 0):
        sys.setswitchinterval(held + 1)  # no other thread runs before this one is done
        end = time.monotonic() + held
        while time.monotonic() < end:
            pass
    ctx.state["ballast"] = b"\\x01" * (payload.get("allocate_mb", 0) << 20)
    ctx.state["pad"] = payload.get("pad_bytes", 0)
    return [{"x": np.asarray(row, np.float32)} for row in payload["rows"]]


def postprocess(items, ctx):
    return {
        "y": [item["y"].tolist() for item in items],
        "pid": os.getpid(),
        "pad": "x" * ctx.state.get("pad", 0),
    }
'''


@contextmanager
def emulated(path: Path, *args: str, timeout_s: float = 90.0) -> Iterator[tuple[str, Server]]:
    """`edgeserve serve PATH --emulate aws-lambda ARGS` on 127.0.0.1:0; yields (url, server)."""
    with running(path, "--emulate", "aws-lambda", *args, timeout_s=timeout_s) as started:
        yield started


def reports(server: Server, containing: str = "REPORT", at_least: int = 1) -> list[str]:
    """The REPORT lines printed so far, once `at_least` of them contain `containing` (a bounded
    wait: a thread reads the output, a little after the HTTP answer arrives)."""
    deadline = time.monotonic() + 10.0
    while True:
        lines = [line for line in list(server.output) if line.startswith("REPORT RequestId:")]
        found = sum(containing in line for line in lines)
        if found >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


FIXTURES = Path(__file__).parent / "fixtures" / "aws_events"


def sample(name: str) -> dict[str, Any]:
    """One of AWS's sample events (fixtures/aws_events)."""
    event: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return event


def changed(name: str, path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A sample event with the field at `path` set to `value` (or removed, for DELETE)."""
    event = copy.deepcopy(sample(name))
    holder = event
    for key in path[:-1]:
        holder = holder[key]
    if value is DELETE:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return event


DELETE = object()

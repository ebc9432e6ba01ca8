"""A built bundle serves without the `onnx` package: the runtime requirements leave it out (it is
23 MB of a Lambda zip), so the serving path must never import it. Checked in a fresh interpreter
where importing onnx raises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgeserve.builder import build
from tests.models import mlp_model, write_function

REQUEST = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
BLOCK_ONNX = """
import sys
class NoOnnx:
    def find_spec(self, name, path=None, target=None):
        if name == "onnx" or name.startswith("onnx."):
            raise ImportError("onnx is not installed here")
sys.meta_path.insert(0, NoOnnx())
"""

LAMBDA = (
    BLOCK_ONNX
    + """
import json
from pathlib import Path
from edgeserve.aws_lambda.adapter import create_handler
handler = create_handler(Path(sys.argv[1]))
print(json.dumps(handler(REQUEST, None)))
"""
)

SERVER = (
    BLOCK_ONNX
    + """
import asyncio
from pathlib import Path
import httpx
from edgeserve.server import load_app

async def main():
    app = load_app(Path(sys.argv[1]), backend="onnxruntime")
    transport = httpx.ASGITransport(app=app)
    async with app.rest.router.lifespan_context(app.rest):
        async with httpx.AsyncClient(transport=transport, base_url="http://fn") as client:
            response = await client.post("/v2/models/mlp/infer", json=REQUEST)
            print(response.status_code)

asyncio.run(main())
"""
)


@pytest.fixture(scope="module")
def bundle_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("noonnx")
    source = write_function(root / "src", mlp_model, '[function]\nname = "mlp"\n')
    return build(source, root / "mlp", targets=("aws-lambda",)).root


def run(script: str, bundle_root: Path) -> str:
    code = script.replace("REQUEST", repr(REQUEST))
    done = subprocess.run(
        [sys.executable, "-c", code, str(bundle_root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_lambda_handler_answers_without_onnx(bundle_root: Path) -> None:
    answer = json.loads(run(LAMBDA, bundle_root))

    assert answer["outputs"][0]["shape"] == [1, 4]


def test_the_http_app_answers_without_onnx(bundle_root: Path) -> None:
    assert run(SERVER, bundle_root) == "200"

"""`make demo`: build the OCR function, serve it on 127.0.0.1, read the sample pages, stop.

Drives the same CLI a user types (`edgeserve build`, `edgeserve serve`) and the HTTP API
(`POST /invoke` with the PNG bytes), then prints what was read beside the truth and the
character error rate (CER = edit distance / truth length, over all sample lines).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "training"))
from evaluate import edit_distance  # noqa: E402

console = Console()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, server: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} was not ready after {timeout_s:.0f} s")


def read_samples(url: str) -> tuple[Table, int, int]:
    table = Table("sample", "line", "truth", "read", "conf", title="functions/ocr samples")
    errors = chars = 0
    for png in sorted((HERE / "samples").glob("*.png")):
        truth = png.with_suffix(".txt").read_text().splitlines()
        reply = httpx.post(
            f"{url}/invoke",
            content=png.read_bytes(),
            headers={"Content-Type": "image/png"},
            timeout=60,
        )
        reply.raise_for_status()
        lines = reply.json()["lines"]
        for number in range(max(len(truth), len(lines))):
            want = truth[number] if number < len(truth) else ""
            got = lines[number] if number < len(lines) else {"text": "", "confidence": 0.0}
            errors += edit_distance(got["text"], want)
            chars += len(want)
            mark = "" if got["text"] == want else "[red]"
            table.add_row(
                png.name, str(number + 1), want, f"{mark}{got['text']}", f"{got['confidence']:.2f}"
            )
    return table, errors, chars


def main() -> int:
    edgeserve = [sys.executable, "-m", "edgeserve"]
    bundle = HERE.parents[1] / "build" / "ocr"
    subprocess.run([*edgeserve, "build", str(HERE), "--out", str(bundle)], check=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [*edgeserve, "serve", str(bundle), "--port", str(port), "--log-level", "warning"]
    )
    try:
        wait_ready(url, server)
        table, errors, chars = read_samples(url)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    console.print(table)
    console.print(
        f"character error rate: {errors / max(chars, 1):.2%} "
        f"({errors} errors in {chars} characters)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

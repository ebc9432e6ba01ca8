"""The servers under test, each its own process on 127.0.0.1: floor, Triton, edgeserve."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
TRITON_PYTHON = HERE / ".venv-triton" / "bin" / "python"
READY_TIMEOUT_S = 120.0


@dataclass
class Server:
    """A running server: what it is, where it listens, how to know it is ready."""

    label: str
    protocol: str
    port: int
    ready_path: str
    process: subprocess.Popen[bytes]
    log: Path
    started: float

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Seconds from spawn to ready; raises with the log tail when it dies or hangs."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.label} exited:\n{self.log.read_text()[-3000:]}")
                try:
                    if client.get(self.ready_path).status_code == 200:
                        return time.monotonic() - self.started
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
        raise RuntimeError(
            f"{self.label} not ready in {timeout_s} s:\n{self.log.read_text()[-3000:]}"
        )

    def rss_mb(self) -> float:
        return rss_mb(self.process.pid)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port(span: int = 1) -> int:
    """A port with `span` consecutive free ports from it (Triton takes http, grpc, metrics)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + span < 65000 and all(_free(port + i) for i in range(1, span)):
            return port


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _spawn(
    label: str,
    protocol: str,
    command: list[str],
    port: int,
    ready: str,
    logs: Path,
    env: dict[str, str] | None = None,
) -> Server:
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{label.replace(' ', '_').replace('/', '-')}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Server(label, protocol, port, ready, process, log, started)


def start_floor(
    label: str, model: Path, name: str, backend: str, precision: str, logs: Path
) -> Server:
    port = free_port()
    command = [sys.executable, str(HERE / "floor_server.py"), str(model), name, str(port)]
    command += ["--backend", backend, "--precision", precision]
    return _spawn(label, "binary", command, port, "/v2/health/ready", logs)


def start_triton(label: str, model: Path, name: str, delay_us: int, logs: Path) -> Server:
    port = free_port(span=3)
    command = [str(TRITON_PYTHON), str(HERE / "triton_server.py"), str(model), name, str(port)]
    command += ["--delay-us", str(delay_us)]
    lib = Path(sys.base_prefix) / "lib"  # the stub must load this interpreter's libpython
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    return _spawn(label, "binary", command, port, f"/v2/models/{name}/ready", logs, env)


def start_edgeserve(
    label: str, function: Path, backend: str, logs: Path, workers: str = "auto"
) -> Server:
    """`edgeserve serve` of the function built beforehand, as a deployed server starts: served
    from its source folder on a cold cache, the server built it itself and kept the build's
    memory (OpenVINO's conversion: 43 MB more for the MLP), which the RSS targets would count."""
    bundle = logs / "bundles" / f"{function.name}-{backend}"  # the work folder, not the source
    build = [sys.executable, "-m", "edgeserve", "build", str(function), "--out", str(bundle)]
    subprocess.run(build, check=True, capture_output=True)
    port = free_port()
    command = [sys.executable, "-m", "edgeserve", "serve", str(bundle), "--port", str(port)]
    command += ["--backend", backend, "--log-level", "warning", "--workers", workers]
    return _spawn(label, "binary", command, port, "/v2/health/ready", logs)


def triton_available() -> str | None:
    """None when the PyTriton venv is there, else why Triton cannot run."""
    if not TRITON_PYTHON.exists():
        return f"no PyTriton venv at {TRITON_PYTHON.parent.parent} (make bench-triton-venv)"
    return None

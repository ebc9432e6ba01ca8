"""Real containers for the image tests: podman configured for this machine, a local OCI
registry (Debian's docker-registry) on 127.0.0.1, and a container run with a published port."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def podman_config(folder: Path) -> Path:
    """containers.conf for this machine: runc (crun fails on its cgroups) and explicit ulimits
    no higher than ours (without CAP_SYS_RESOURCE a container cannot raise them)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    path = folder / "containers.conf"
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=4096:4096"]\n'
        '[engine]\nruntime = "runc"\n'
    )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float, status: int = 200) -> float:
    """Seconds until `url` answers `status` (bounded)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if httpx.get(url, timeout=1).status_code == status:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{url} did not answer {status} within {timeout_s}s")


@contextmanager
def registry(folder: Path) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1 with its own config and storage; yields host:port."""
    port = free_port()
    config = folder / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    process = subprocess.Popen(
        [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/", 30)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextmanager
def container(image: str, port: int = 8080) -> Iterator[tuple[str, str, float]]:
    """`podman run` the image with its port published on 127.0.0.1; yields (name, URL, the
    seconds from `podman run` to a ready answer); removes the container afterwards."""
    name = f"edgeserve-test-{uuid.uuid4().hex[:8]}"
    host_port = free_port()
    started = time.monotonic()
    subprocess.run(
        ["podman", "run", "-d", "--name", name, "-p", f"127.0.0.1:{host_port}:{port}", image],
        check=True,
        capture_output=True,
    )
    url = f"http://127.0.0.1:{host_port}"
    try:
        try:
            wait_http(f"{url}/v2/health/ready", 120)
        except TimeoutError as exc:
            logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
            raise TimeoutError(f"{exc}; container log:\n{logs.stdout}{logs.stderr}") from None
        yield name, url, time.monotonic() - started
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, check=False)


def podman_available() -> str | None:
    """Why the image tests cannot run here, or None when they can."""
    for tool in ("podman", "runc", "debootstrap", "docker-registry", "catatonit"):
        if shutil.which(tool) is None and not Path(f"/usr/bin/{tool}").exists():
            return f"{tool} is not installed (scripts/system-deps.sh installs it)"
    return None if os.geteuid() == 0 else "debootstrap needs root"

"""A "device" whose PID 1 is systemd: a podman container of Debian bookworm reached over its sshd.

The base image is made here, not pulled (no registry is needed): `debootstrap` writes a bookworm
root filesystem with systemd, sshd, python3 and python3-venv, `podman import` turns it into an
image, and both the tarball and the image are cached (~/.cache/edgeserve-test/), so only the
first run pays the few minutes it takes. Everything specific to one test (the port sshd listens
on, its host key, the authorized client key, the pip configuration) is mounted at `podman run`,
so the image never changes between tests.

The container shares the host's network (`--network host`): its sshd and the function it serves
listen on 127.0.0.1 ports chosen by the test, which the test polls directly.

Needs root, podman, runc and debootstrap (scripts/system-deps.sh installs them).
"""

from __future__ import annotations

import getpass
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgeserve-test"
PACKAGES = (
    "systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,rsync,procps,"
    "libgomp1"  # onnxruntime's OpenMP runtime, as on a JetPack root filesystem
)
RECIPE = f"debootstrap --variant=minbase --include={PACKAGES} bookworm"
IMAGE = f"localhost/edgeserve-test-systemd:{hashlib.sha256(RECIPE.encode()).hexdigest()[:12]}"
# explicit limits: this machine's defaults are above what runc may set here (EPERM)
PODMAN_RUN = ["podman", "run", "--runtime", "runc", "--ulimit", "nofile=16384:16384",
              "--ulimit", "nproc=16384:16384"]  # fmt: skip
BOOT_TIMEOUT_S = 60.0

SSHD_DROP_IN = """\
Port {port}
ListenAddress 127.0.0.1
PasswordAuthentication no
PermitRootLogin prohibit-password
"""


def systemd_device_missing() -> str | None:
    """Why a systemd container cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (debootstrap and a container whose PID 1 is systemd)"
    for tool in ("podman", "runc", "debootstrap", "ssh-keygen"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"no {tool} (bash scripts/system-deps.sh installs it)"
    return None


def ensure_image() -> str:
    """The cached image, imported from the cached rootfs tarball, built when both are absent."""
    if _podman_ok(["image", "exists", IMAGE]):
        return IMAGE
    tarball = CACHE / f"{IMAGE.rsplit(':', 1)[1]}-rootfs.tar"
    if not tarball.exists():
        _debootstrap(tarball)
    subprocess.run(["podman", "import", str(tarball), IMAGE], check=True, capture_output=True)
    return IMAGE


def _debootstrap(tarball: Path) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        rootfs = Path(work) / "rootfs"
        subprocess.run([*RECIPE.split(), str(rootfs)], check=True, capture_output=True)
        # sshd's own host keys are generated at install; tests mount their own key instead
        for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.replace(tarball)


def _podman_ok(args: list[str]) -> bool:
    return subprocess.run(["podman", *args], capture_output=True).returncode == 0


@dataclass
class SystemdDevice:
    """A running container: its name, and the ssh config whose alias `device` reaches it."""

    name: str
    ssh_config: Path
    folder: Path

    def exec(self, *argv: str) -> str:
        """Run a command inside the container (as an operator at the console would)."""
        done = subprocess.run(
            ["podman", "exec", self.name, *argv], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv}: {done.returncode}: {done.stderr}")
        return done.stdout

    def stop(self) -> None:
        subprocess.run(["podman", "rm", "-f", "-t", "5", self.name], capture_output=True)


def start_device(folder: Path, ssh_port: int, mounts: dict[Path, str]) -> SystemdDevice:
    """Boot a container from the image with sshd on 127.0.0.1:`ssh_port`; the caller stops it."""
    image = ensure_image()
    folder.mkdir(parents=True, exist_ok=True)
    identity = _keygen(folder / "client_key")
    host_key = _keygen(folder / "host_key")
    (folder / "sshd.conf").write_text(SSHD_DROP_IN.format(port=ssh_port))
    (folder / "authorized_keys").write_text(identity.with_suffix(".pub").read_text())
    files = {
        host_key: "/etc/ssh/ssh_host_ed25519_key",
        host_key.with_suffix(".pub"): "/etc/ssh/ssh_host_ed25519_key.pub",
        folder / "sshd.conf": "/etc/ssh/sshd_config.d/edgeserve-test.conf",
        folder / "authorized_keys": "/root/.ssh/authorized_keys",
        **mounts,
    }
    name = f"edgeserve-test-systemd-{uuid.uuid4().hex[:8]}"
    argv = [*PODMAN_RUN, "--detach", "--name", name, "--systemd=always", "--network", "host"]
    for source, target in files.items():
        argv += ["--volume", f"{source}:{target}:ro"]
    subprocess.run([*argv, image, "/sbin/init"], check=True, capture_output=True)
    device = SystemdDevice(name, _client_config(folder, ssh_port, identity, host_key), folder)
    try:
        _await_ssh(device)
    except BaseException:
        device.stop()
        raise
    return device


def _client_config(folder: Path, port: int, identity: Path, host_key: Path) -> Path:
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.with_suffix('.pub').read_text()}")
    config = folder / "ssh_config"
    config.write_text(
        f"Host device\n    HostName 127.0.0.1\n    Port {port}\n    User root\n"
        f"    IdentityFile {identity}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known_hosts}\n    StrictHostKeyChecking yes\n"
    )
    return config


def _keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", getpass.getuser(), "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def _await_ssh(device: SystemdDevice) -> None:
    """Wait until systemd has booted far enough that sshd accepts our key."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    argv = ["ssh", "-F", str(device.ssh_config), "-o", "BatchMode=yes", "device", "true"]
    while time.monotonic() < deadline:
        if subprocess.run(argv, capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"container {device.name}: no sshd after {BOOT_TIMEOUT_S} s")


def device_wheelhouse(requirements: Path, scratch: Path) -> Path:
    """Wheels for the device's pip: this checkout's edgeserve and everything the bundle pins.

    A Jetson gets them from PyPI or a local mirror; this device gets them from a folder mounted
    at /wheels (its /etc/pip.conf says `no-index`), so the deploy's own venv + pip install step
    runs for real, offline. Third-party wheels are cached; edgeserve's is built each session."""
    scratch.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    checkout = Path(__file__).resolve().parents[1]
    subprocess.run(
        [*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(scratch),
         str(checkout)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = scratch.glob("edgeserve-*.whl")
    key = hashlib.sha256(requirements.read_bytes() + _dependencies(checkout)).hexdigest()[:12]
    cached = CACHE / f"wheels-{key}"
    if not cached.is_dir():
        partial = CACHE / f"wheels-{key}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(
            [*pip, "download", "--quiet", "--only-binary=:all:", "-d", str(partial),
             "-r", str(requirements), str(wheel)],
            check=True, capture_output=True,
        )  # fmt: skip
        (partial / wheel.name).unlink()
        partial.rename(cached)
    house = scratch / "wheelhouse"
    shutil.copytree(cached, house)
    shutil.copy2(wheel, house)
    return house


def _dependencies(checkout: Path) -> bytes:
    """edgeserve's own runtime dependencies, as pyproject.toml lists them (the cache key)."""
    return (
        tomllib.loads((checkout / "pyproject.toml").read_text())["project"]["dependencies"]
        .__repr__()
        .encode()
    )


PIP_CONF = "[global]\nno-index = true\nfind-links = /wheels\n"
"""The device's /etc/pip.conf: wheels from the mounted folder only (an offline Jetson's mirror)."""


CONTAINERFILE = """\
FROM {base}
COPY wheelhouse /wheels
RUN python3 -m venv /opt/edgeserve && \\
    /opt/edgeserve/bin/pip install --no-index --find-links /wheels {packages} && rm -rf /wheels
ENV PATH=/opt/edgeserve/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""
"""An image with edgeserve in it, as the docker service manager expects (an L4T image on a
Jetson: NVIDIA's base with edgeserve installed)."""


def serving_image(wheelhouse: Path, scratch: Path) -> str:
    """Build (podman build) the serving image from the base image and the wheelhouse."""
    digest = hashlib.sha256()
    for wheel in sorted(wheelhouse.glob("*.whl")):
        digest.update(wheel.name.encode() + hashlib.sha256(wheel.read_bytes()).digest())
    repository = "localhost/edgeserve-test-serving"
    tag = f"{repository}:{digest.hexdigest()[:12]}"
    if _podman_ok(["image", "exists", tag]):
        return tag
    # each checkout's edgeserve wheel makes a new image: keep only the newest (~0.9 GB each)
    listed = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", repository],
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    for stale in listed:
        subprocess.run(["podman", "rmi", "-f", stale], capture_output=True)
    context = scratch / "image"
    shutil.copytree(wheelhouse, context / "wheelhouse")
    packages = " ".join(sorted(w.name.split("-")[0] for w in wheelhouse.glob("*.whl")))
    (context / "Containerfile").write_text(
        CONTAINERFILE.format(base=ensure_image(), packages=packages)
    )
    subprocess.run(
        ["podman", "build", "--runtime", "runc", "--ulimit", "nofile=16384:16384",
         "--ulimit", "nproc=16384:16384", "-t", tag, str(context)],
        check=True, capture_output=True,
    )  # fmt: skip
    return tag


DOCKER_SHIM = """\
#!/bin/sh
# `docker` on the test device: podman's docker-compatible CLI, with the limits runc needs here
if [ "$1" = run ]; then
    shift
    exec podman run --ulimit nofile=16384:16384 --ulimit nproc=16384:16384 "$@"
fi
exec podman "$@"
"""

"""Which image tool builds: podman, buildah or docker, whichever works here, and why.

Order: podman first (daemonless and rootless, builds with buildah's engine, and can also
run the image and report each layer's size), then buildah (the same builds, but no layer
sizes), then docker (needs its daemon running: the CLI alone cannot build).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from edgeserve.errors import ConfigError, did_you_mean

TOOLS = ("podman", "buildah", "docker")
WHY = {
    "podman": "daemonless and rootless; builds with buildah's engine; runs and measures layers",
    "buildah": "daemonless builds (no podman here); layer sizes are not reported",
    "docker": "its daemon answers (no podman or buildah here)",
}


@dataclass(frozen=True)
class ImageTool:
    """A working image tool: its name, where it is, its version and why it was chosen."""

    name: str
    path: str
    version: str
    why: str

    def argv(self, *args: str) -> list[str]:
        return [self.path, *args]


def find_tool(prefer: str = "auto") -> ImageTool:
    """The first tool of TOOLS that works (or the preferred one, which must work)."""
    names = TOOLS if prefer == "auto" else (prefer,)
    if prefer not in (*TOOLS, "auto"):
        known = ["auto", *TOOLS]
        raise ConfigError(
            f"image tool {prefer!r}: expected one of {known}{did_you_mean(prefer, known)}"
        )
    problems = []
    for name in names:
        tool, problem = _probe(name)
        if tool is not None:
            return tool
        problems.append(f"{name}: {problem}")
    raise ConfigError(
        "no image tool works here: " + "; ".join(problems) + ". Hint: install podman "
        "(apt install podman runc) or start the docker daemon"
    )


def describe_tools() -> list[tuple[str, str]]:
    """Rows for `doctor`: each tool, found or not, and the one builds would use."""
    rows = []
    for name in TOOLS:
        tool, problem = _probe(name)
        rows.append((f"image tool {name}", tool.version if tool else f"unusable: {problem}"))
    try:
        chosen = find_tool()
        rows.append(("image builds with", f"{chosen.name}: {chosen.why}"))
    except ConfigError as exc:
        rows.append(("image builds with", exc.message))
    return rows


def _probe(name: str) -> tuple[ImageTool | None, str]:
    path = shutil.which(name)
    if path is None:
        return None, "not installed"
    # docker's client prints its version without a daemon; the server's version needs one
    check = (
        [path, "version", "--format", "{{.Server.Version}}"]
        if name == "docker"
        else [path, "--version"]
    )
    try:
        done = subprocess.run(check, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0 or not done.stdout.strip():
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        return None, lines[-1]
    version = done.stdout.strip().splitlines()[0]
    return ImageTool(name, path, version, WHY[name]), ""

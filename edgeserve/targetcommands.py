"""The verbs that act on a function where it is deployed: deploy, status, rollback, stop. Each
takes the target's profile and hands the work to its driver (edgeserve.targets)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgeserve.errors import ConfigError, DeployError
from edgeserve.printed import console, err_console, say
from edgeserve.progress import live_log


def deploy_command(args: argparse.Namespace) -> int:
    from edgeserve.targets import deploy

    with live_log(err_console, f"deploying to {args.target}"):
        result = deploy(Path(args.path), args.target, hosts=args.host)
    where = f" at {result.url}" if result.url else ""
    say("deployed", "green", f"{result.name} {result.version} to {result.target}{where}")
    return 0


def status_command(args: argparse.Namespace) -> int:
    from edgeserve.targets import driver_for, target_profile

    profile = target_profile(args.target, Path(args.path), args.host)
    report = driver_for(profile).status(function_name(args.path), profile)
    console.print_json(json.dumps(report))
    unreachable = [
        key for key, part in report.items() if isinstance(part, dict) and "error" in part
    ]
    if unreachable:
        say("error:", "red", f"no status from {', '.join(unreachable)} (see `error`)", err_console)
        return DeployError.exit_code
    return 0


def rollback_command(args: argparse.Namespace) -> int:
    from edgeserve.targets import driver_for, target_profile

    profile = target_profile(args.target, Path(args.path), args.host)
    result = driver_for(profile).rollback(function_name(args.path), profile)
    say("rolled back", "green", f"{result.name} on {result.target} to {result.version}")
    return 0


def stop_command(args: argparse.Namespace) -> int:
    from edgeserve.targets import driver_for, target_profile

    profile = target_profile(args.target, Path(args.path), args.host)
    stop = getattr(driver_for(profile), "stop", None)
    if stop is None:
        raise ConfigError(f"target {profile.name!r} (driver {profile.driver}) has no `stop`")
    stop(function_name(args.path), profile)
    say("stopped", "green", f"{function_name(args.path)} on {profile.name}")
    return 0


def function_name(path: str) -> str:
    """The function a source folder or bundle holds (a bare name is taken as is)."""
    from edgeserve.bundle import BUNDLE_FILE, Bundle
    from edgeserve.manifest import MANIFEST_NAME, load_manifest

    folder = Path(path)
    if (folder / BUNDLE_FILE).is_file():
        return Bundle.open(folder).name
    if (folder / MANIFEST_NAME).is_file():
        return load_manifest(folder).function.name
    return path

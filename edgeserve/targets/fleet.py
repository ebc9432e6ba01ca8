"""A fleet of devices: one action on every host, canary first, and every failure told whole.

The first host is the canary: it goes alone, and when it fails nothing else is touched. The
rest go `max_parallel` at a time; one failing does not hide another, and the message counts the
whole fleet and says which hosts now run the new release (they stay on it until rolled back).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from edgeserve.errors import DeployError, EdgeserveError

T = TypeVar("T")


def rollout(
    hosts: tuple[str, ...],
    limit: int,
    canary: bool,
    each: Callable[[str], T],
    outcome: str = "on the new release",
) -> dict[str, T]:
    """Run `each` on the canary, then on the others in parallel; a failing canary stops it all.

    `outcome` names what hosts that succeeded are left with, for the message when others fail."""
    if len(hosts) == 1:
        return {hosts[0]: each(hosts[0])}
    if not canary:
        return _all_or_raise(hosts, *on_every(hosts, limit, each), None, outcome)
    first, rest = hosts[0], hosts[1:]
    try:
        done = {first: each(first)}
    except EdgeserveError as exc:
        raise type(exc)(
            f"canary {first} failed, rollout stopped; not touched: {list(rest)}:\n{exc.message}"
        ) from None
    more, failures = on_every(rest, limit, each)
    return _all_or_raise(hosts, {**done, **more}, failures, first, outcome)


def on_every(
    hosts: tuple[str, ...], limit: int, each: Callable[[str], T]
) -> tuple[dict[str, T], dict[str, str]]:
    """`each` on every host, `limit` at a time: what each returned, and each host's error."""
    with ThreadPoolExecutor(max_workers=limit) as pool:
        futures = {host: pool.submit(each, host) for host in hosts}
    done, failures = {}, {}
    for host, future in futures.items():
        error = future.exception()
        if error is None:
            done[host] = future.result()
        else:
            failures[host] = error.message if isinstance(error, EdgeserveError) else repr(error)
    return done, failures


def _all_or_raise(
    hosts: tuple[str, ...],
    done: dict[str, T],
    failures: dict[str, str],
    canary: str | None,
    outcome: str,
) -> dict[str, T]:
    if not failures:
        return done
    lines = [f"{host}: {message}" for host, message in failures.items()]
    kept = [f"{host} (canary)" if host == canary else host for host in hosts if host in done]
    stays = f"; {', '.join(kept)} succeeded and stay{'s' if len(kept) == 1 else ''} {outcome}"
    stays = stays if kept else ""
    raise DeployError(f"{len(failures)} of {len(hosts)} hosts failed{stays}:\n" + "\n".join(lines))

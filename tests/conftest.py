"""Keep every test's side effects inside pytest's temporary folders, and its garbage its own."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from types import ModuleType

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Bundles built from source folders (and servers started by tests) cache here, not in ~."""
    os.environ["EDGESERVE_CACHE_DIR"] = str(tmp_path_factory.mktemp("edgeserve-cache"))


@pytest.fixture(autouse=True)
def triton_clients_freed_here(request: pytest.FixtureRequest) -> Iterator[None]:
    """tritonclient.http's clients run on gevent: one the garbage collector frees on another
    thread (a later test's pool) raises gevent's InvalidThreadUseError in its __del__, which
    pytest then counts against whichever test is running. So after each test of a module that
    uses tritonclient, its garbage is collected here, on the main thread."""
    yield
    if _uses_tritonclient(request.module):
        gc.collect()


def _uses_tritonclient(module: ModuleType) -> bool:
    return any(
        (getattr(value, "__name__", "") or getattr(value, "__module__", "") or "").startswith(
            "tritonclient"
        )
        for value in vars(module).values()
    )

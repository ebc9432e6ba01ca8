"""Keep every test's side effects inside pytest's temporary folders."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Bundles built from source folders (and servers started by tests) cache here, not in ~."""
    os.environ["EDGESERVE_CACHE_DIR"] = str(tmp_path_factory.mktemp("edgeserve-cache"))

"""The HTTP face of a function: KServe v2 (Triton's dialect), `/invoke` and `/metrics`."""

from edgeserve.http.app import create_app

__all__ = ["create_app"]

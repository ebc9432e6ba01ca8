"""Local emulation of deploy targets: `serve --emulate aws-lambda` runs a bundle as Lambda does."""

from __future__ import annotations

EMULATORS = ("aws-lambda",)

"""Cold start of a function image: `podman run` to the first 200 on /v2/health/ready.

    python benchmarks/image_cold_start.py IMAGE [--runs 5]

Prints one row per run and the median; the image's size and layers are in `edgeserve build`'s
report (image.txt). Uses podman as configured (CONTAINERS_CONF) and 127.0.0.1 ports.
"""

from __future__ import annotations

import argparse
import statistics

from tests.containers import container


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    seconds = []
    for run in range(args.runs):
        with container(args.image) as (_, _, took):
            seconds.append(took)
        print(f"run {run + 1}: {took:.2f} s to ready")
    print(
        f"median {statistics.median(seconds):.2f} s, min {min(seconds):.2f} s, "
        f"max {max(seconds):.2f} s over {args.runs} runs"
    )


if __name__ == "__main__":
    main()

"""The SLO planner against fixed max_queue_delay settings, in a noise-free simulation."""

from __future__ import annotations

import pytest

from tests.slo_simulation import capacity, fixed, simulate, with_slo

SLO_MS = 50.0
DELAYS_MS = (0.0, 2.0, 10.0)


@pytest.mark.parametrize("share", [0.3, 0.6, 0.9, 1.2])
def test_slo_keeps_p99_where_a_fixed_delay_can_and_serves_at_least_as_many_in_time(
    share: float,
) -> None:
    rate = share * capacity()
    fixed_runs = [simulate(fixed(delay), rate, SLO_MS, seconds=5) for delay in DELAYS_MS]
    slo = simulate(with_slo(SLO_MS), rate, SLO_MS, seconds=5)
    if any(run.p99_ms <= SLO_MS for run in fixed_runs):
        assert slo.p99_ms <= SLO_MS
    assert slo.goodput_per_s >= 0.99 * max(run.goodput_per_s for run in fixed_runs)


def test_overload_is_shed_early_and_the_rest_answered_in_time() -> None:
    slo = simulate(with_slo(SLO_MS), 1.2 * capacity(), SLO_MS, seconds=5)
    assert 0.1 < slo.shed < 0.5
    assert slo.p99_ms <= SLO_MS
    assert slo.goodput_per_s >= 0.99 * slo.served_per_s  # what is answered is in time

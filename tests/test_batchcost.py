"""What the batcher learns online: batch cost by size, arrival rate, whether waits pay."""

from __future__ import annotations

import pytest

from edgeserve.batching.cost import ArrivalMeter, CostModel, Outlook, WaitMeter


def linear(rows: int) -> float:
    return 0.005 + 0.001 * rows


def test_cost_model_extrapolates_a_line_to_sizes_never_seen() -> None:
    model = CostModel(max_rows=32)
    for _ in range(30):
        for rows in (1, 2, 4, 8):
            model.observe(rows, linear(rows))
    assert model.predict(16) == pytest.approx(linear(16), rel=0.05)
    assert model.predict(32) == pytest.approx(linear(32), rel=0.05)
    assert len(model.table) == 32
    assert model.table[3] == pytest.approx(linear(4))


def test_cost_model_follows_a_slower_machine() -> None:
    model = CostModel(max_rows=8)
    for _ in range(20):
        model.observe(4, 0.010)
    for _ in range(20):
        model.observe(4, 0.030)
    assert model.predict(4) == pytest.approx(0.030, rel=0.01)


def test_cost_model_caps_a_single_spike() -> None:
    model = CostModel(max_rows=4)
    for _ in range(10):
        model.observe(2, 0.010)
    model.observe(2, 1.0)  # preempted for a second on a shared machine
    assert model.predict(2) == pytest.approx(0.010 + 0.2 * (0.030 - 0.010))


def test_cost_model_with_one_size_seen_predicts_no_less_for_larger_batches() -> None:
    model = CostModel(max_rows=8)
    model.observe(1, 0.004)
    assert model.predict(1) == 0.004
    assert model.predict(8) >= 0.004
    assert model.predict(1) > 0


def test_cost_model_ignores_nonsense_observations() -> None:
    model = CostModel(max_rows=4)
    model.observe(0, 0.01)
    model.observe(2, float("nan"))
    model.observe(2, -1.0)
    assert model.table == ()


def test_outlook_cost_beyond_the_table_scales_per_row_and_backlog_adds_batches() -> None:
    outlook = Outlook(cost=(0.01, 0.02))
    assert outlook.cost_of(4) == pytest.approx(0.04)
    assert Outlook().cost_of(3) == 0.0
    # 5 rows at max 2 on 2 instances: two full batches shared by two workers, then one row
    assert outlook.backlog_s(5, max_rows=2, instances=2) == pytest.approx(2 * 0.02 / 2 + 0.01)


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(0.0, 1), (50.0, 1), (120.0, 2), (1000.0, 8)],
    ids=["idle", "batch 1 keeps up", "needs 2", "cannot keep up: max"],
)
def test_rows_to_keep_up(rate: float, expected: int) -> None:
    outlook = Outlook(cost=tuple(0.010 + 0.001 * (b - 1) for b in range(1, 9)), arrival_rate=rate)
    assert outlook.rows_to_keep_up(8, headroom=1.25) == expected


def test_arrival_meter_measures_items_per_second() -> None:
    meter = ArrivalMeter()
    assert meter.rate == 0.0
    for step in range(50):
        meter.arrived(step * 0.01, 2)
    assert meter.rate == pytest.approx(200.0)


def test_wait_meter_stops_waiting_when_waits_gather_nobody_and_backs_off_its_probes() -> None:
    meter = WaitMeter(probe_every=4, max_gap=8)
    assert meter.pays()
    for _ in range(4):
        meter.waited(0)
    assert [meter.pays() for _ in range(4)] == [False, False, False, True]
    meter.waited(0)  # the probe gathered nobody: the next one comes after 8
    assert [meter.pays() for _ in range(8)] == [False] * 7 + [True]
    meter.waited(3)  # company is back
    assert meter.pays()

"""The rule that sizes a reader's downloads in flight to the store (wdsprep/remote/pace.py): pure arithmetic."""

from __future__ import annotations

import pytest

from wdsprep.plan.options import FetchOptions
from wdsprep.remote.pace import Estimate, Gauge, window

MB = 1_000_000
# A store across a network: 50 ms to the first byte, 25 MB/s a connection; a reader at 0.1 s a batch.
SLOW_STORE = Estimate(latency=0.05, bandwidth=25 * MB, batch_seconds=0.1)


def one_a_batch(size: int, n: int) -> list[tuple[int, float]]:
    """``n`` shards of ``size`` bytes, the k-th first needed k batches from now."""
    return [(size, k) for k in range(n)]


def test_before_the_pace_is_measured_it_starts_what_the_budget_allows():
    assert window(one_a_batch(7 * MB, 20), Estimate(), most=16) == 20
    assert window([], Estimate(), most=16) == 0
    assert window(one_a_batch(80 * MB, 20), Estimate(), most=16, budget=512 * 2**20) == 6
    # Latency and bandwidth measured, not yet how fast the reader reads: still the budget's worth.
    half = Estimate(latency=0.05, bandwidth=25 * MB)
    assert window(one_a_batch(80 * MB, 20), half, most=16, budget=512 * 2**20, waiting=160 * MB) == 4


def test_a_slow_store_keeps_enough_in_flight_to_cover_its_latency_and_bandwidth():
    # A 7 MB shard takes 0.05 + 7/25 = 0.33 s on its connection, 0.66 s with the margin: the shards
    # needed within 0.66 s (6 batches of 0.1 s) are started: k = 0..6.
    assert window(one_a_batch(7 * MB, 20), SLOW_STORE, most=16) == 7
    # 80 MB read at one a second: 3.25 s a fetch, 6.5 s with the margin: k = 0..6.
    second = Estimate(latency=0.05, bandwidth=25 * MB, batch_seconds=1.0)
    assert window(one_a_batch(80 * MB, 40), second, most=16) == 7
    # A reader that outruns what 16 connections carry (800 MB/s against 400): all of it, as far as
    # the budget lets.
    assert window(one_a_batch(80 * MB, 40), SLOW_STORE, most=16) == 40
    # Ten times the latency wants more ahead (0.78 s a fetch: k = 0..15); a trainer ten times slower, fewer.
    far = Estimate(latency=0.5, bandwidth=25 * MB, batch_seconds=0.1)
    assert window(one_a_batch(7 * MB, 40), far, most=16) == 16
    slow_trainer = Estimate(latency=0.05, bandwidth=25 * MB, batch_seconds=1.0)
    assert window(one_a_batch(7 * MB, 20), slow_trainer, most=16) == 1


def test_a_fast_store_needs_only_what_the_batch_read_now_needs():
    fast = Estimate(latency=0.001, bandwidth=2000 * MB, batch_seconds=0.1)
    assert window(one_a_batch(7 * MB, 20), fast, most=16) == 1
    assert window([(7 * MB, 0)] * 5 + one_a_batch(7 * MB, 20)[1:], fast, most=16) == 5


def test_a_burst_is_started_early_enough_for_its_last_shard():
    # A new length pool 30 batches (3 s) away needs 95 shards together: on 16 connections the last
    # arrives 0.05 + 665/400 = 1.7 s after they start, 3.4 s with the margin: start them all now;
    # one shard needed then could wait.
    assert window([(7 * MB, 30)] * 95, SLOW_STORE, most=16) == 95
    assert window([(7 * MB, 30)], SLOW_STORE, most=16) == 0
    assert window([(7 * MB, 40)] * 95, SLOW_STORE, most=16) == 0  # 4 s away: not yet


def test_bytes_bound_the_window_not_a_count():
    now = [(80 * MB, 0)] * 16
    assert window(now, SLOW_STORE, most=16, budget=512 * 2**20) == 6  # 6 x 80 MB <= 512 MiB < 7 x
    assert window([(7 * MB, 0)] * 16, SLOW_STORE, most=16, budget=512 * 2**20) == 16
    assert window(now, SLOW_STORE, most=16, budget=10 * MB) == 1  # nothing waits: the next one
    assert window(now, SLOW_STORE, most=16, budget=512 * 2**20, waiting=500 * MB) == 0
    assert window(now, Estimate(), most=16, budget=100 * MB) == 1  # unmeasured too
    assert window(now, Estimate(), most=16, budget=100 * MB, waiting=30 * MB) == 0  # no room now


def test_the_gauge_measures_the_pace_of_reading_not_of_waiting():
    g = Gauge()
    g.reached(0, now=0.0)
    g.waited(0.8)  # a shard was late: 0.8 s of the 1.0 s were waiting, not reading
    g.reached(2, now=1.0)
    assert g.estimate.batch_seconds == pytest.approx(0.1)  # 0.2 s of reading for 2 batches
    g.fetched(first_byte=0.05, body=0.4, size=10 * MB)
    assert (g.estimate.latency, g.estimate.bandwidth) == (pytest.approx(0.05), pytest.approx(25 * MB))
    assert g.estimate.known
    g.restart()  # a new epoch: the gap between epochs is no reading
    g.reached(0, now=100.0)
    g.reached(1, now=100.1)
    assert g.estimate.batch_seconds == pytest.approx(0.1)


def test_the_window_follows_the_store_when_it_speeds_up():
    g = Gauge()
    g.fetched(first_byte=0.5, body=1.0, size=10 * MB)  # a slow store first
    g.estimate.batch_seconds = 0.05
    slow = window(one_a_batch(7 * MB, 64), g.estimate, most=32)
    for _ in range(20):  # then a fast one: the averages follow within a few shards
        g.fetched(first_byte=0.002, body=0.01, size=10 * MB)
    fast = window(one_a_batch(7 * MB, 64), g.estimate, most=32)
    assert slow > 20 and fast == 1


def test_fetch_options_check_the_read_ahead_values():
    assert FetchOptions().read_ahead is None  # sized to the store by default
    assert FetchOptions(read_ahead=0).read_ahead == 0
    with pytest.raises(ValueError, match="read_ahead must be >= 0"):
        FetchOptions(read_ahead=-1)
    with pytest.raises(ValueError, match="max_requests must be >= 1"):
        FetchOptions(max_requests=0)

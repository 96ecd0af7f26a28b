"""The allow-rate gate (M3 §4.2), driven by explicit times."""

import pytest

from memcolo import AllowRateGate


def test_full_rate_without_signals():
    g = AllowRateGate(5, clock=lambda: 100.0)
    assert g.allow_rate() == 1.0
    assert all(g.admit() for _ in range(50))


def test_zero_while_first_signal_is_handled():
    g = AllowRateGate(5)
    g.signal_received(now=10.0)
    assert g.allow_rate(now=13.0) == 0.0
    assert not g.admit(now=13.0)


def test_linear_growth_over_num_epochs():
    g = AllowRateGate(5)
    g.signal_received(now=0.0)
    g.signal_handled(now=2.0)  # epoch 2 s, window 10 s
    assert g.allow_rate(now=1.0) == pytest.approx(0.1)
    assert g.allow_rate(now=5.0) == pytest.approx(0.5)
    assert g.allow_rate(now=11.0) == 1.0


def test_only_every_floor_one_over_r_th_allocation_proceeds():
    g = AllowRateGate(1)
    g.signal_received(now=0.0)
    g.signal_handled(now=10.0)
    assert [g.admit(now=2.5) for _ in range(8)] == [False, False, False, True] * 2
    assert [g.admit(now=3.0) for _ in range(6)] == [False, False, True] * 2


def test_before_alloc_evicts_when_not_admitted_and_new_signal_resets():
    t = [0.0]
    g = AllowRateGate(1, clock=lambda: t[0])
    g.signal_received()
    t[0] = 1.0
    g.signal_handled()
    t[0] = 5.0
    assert g.allow_rate() == 1.0
    g.signal_received()
    evicted = []
    assert g.before_alloc(lambda: evicted.append(1)) is True
    assert evicted == [1]


def test_bad_num_epochs():
    with pytest.raises(ValueError):
        AllowRateGate(0)


def test_fast_handler_is_held_to_the_minimum_epoch():
    # A handler done in 10 ms, NUM_epochs 1: without a floor r would be 1 after
    # 10 ms; with the 1 s floor it is 0.2 at the next poll of a 200 ms agent.
    g = AllowRateGate(1)
    g.signal_received(now=0.0)
    g.signal_handled(now=0.010)
    assert g.epoch_s == 1.0
    assert g.allow_rate(now=0.2) == pytest.approx(0.2)
    assert [g.admit(now=0.2) for _ in range(5)] == [False] * 4 + [True]
    assert g.allow_rate(now=1.0) == 1.0
    # Handling longer than the floor is the epoch itself.
    g.signal_received(now=2.0)
    g.signal_handled(now=5.0)
    assert g.epoch_s == pytest.approx(3.0)


def test_zero_floor_is_the_paper_to_the_letter():
    g = AllowRateGate(1, min_epoch_s=0)
    g.signal_received(now=0.0)
    g.signal_handled(now=0.010)
    assert g.allow_rate(now=0.010) == 1.0
    with pytest.raises(ValueError):
        AllowRateGate(1, min_epoch_s=-1)

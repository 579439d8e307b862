"""One rollout's counts feed the three watches together (:mod:`paw_lightning.training.rollout_watch`)."""
from __future__ import annotations

from paw_lightning.training.rollout_watch import RolloutCounts, RolloutWatch, rollout_counts


def test_counts_of_one_process_are_its_own():
    assert rollout_counts(8, 64, 3, 2, False) == RolloutCounts(episodes=8, steps=64, invalid_steps=3, wins=2, flat=False)
    assert rollout_counts(8, 64, 0, 0, True).flat


def test_each_watch_speaks_for_its_own_failure():
    watch = RolloutWatch()
    healthy = RolloutCounts(episodes=8, steps=64, invalid_steps=0, wins=3, flat=False)
    assert watch.observe(healthy, top_action_share=0.5) == []
    # one action on 63 of 64 valid steps, no win: only the collapse watch speaks
    collapsed = RolloutCounts(episodes=8, steps=64, invalid_steps=0, wins=0, flat=False)
    (warning,) = watch.observe(collapsed, top_action_share=63 / 64)
    assert "collapsed onto one action" in warning and "98% of the rollout's 64 valid steps" in warning
    # a fresh run whose invalid rate climbs 6, 13, 19, 26 of 64 steps: three rises in a row, the drift warning on the third
    watch = RolloutWatch()
    for invalid in (6, 13, 19):
        assert watch.observe(RolloutCounts(8, 64, invalid, 1, False), 0.5) == []
    (warning,) = watch.observe(RolloutCounts(8, 64, 26, 1, False), 0.5)
    assert "invalid-action rate rose in 3 updates in a row (9% → 20% → 30% → 41%)" in warning


def test_no_signal_warning_reports_the_success_rate_over_every_episode():
    watch = RolloutWatch()
    flat = RolloutCounts(episodes=16, steps=100, invalid_steps=0, wins=4, flat=True)  # every group all-won or all-lost
    assert watch.observe(flat, 0.4) == [] and watch.observe(flat, 0.4) == []
    (warning,) = watch.observe(flat, 0.4)
    assert "no learning signal for 3 updates in a row" in warning and "success rate of the last rollout 25%" in warning

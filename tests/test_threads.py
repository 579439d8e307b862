"""``threads: auto``: torch threads from the cores other processes leave free."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.training import threads


@pytest.mark.parametrize("cores,busy,expected", [(2, 0.0, 2), (2, 0.3, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.0, 1), (16, 3.4, 13), (16, 3.6, 12)])
def test_free_cores(cores, busy, expected):
    assert threads.free_cores(cores, busy) == expected


@pytest.fixture()
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_auto_takes_the_free_cores_and_says_so(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores", lambda interval=0.5: 1.0)  # another process holds one core
    assert threads.choose_threads("auto") == "torch threads: 1 of 2 cores (1.0 busy with other processes; set threads: N to choose)"
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("loads,expected", [([1.0, 0.1, 1.0], 2), ([1.0, 0.9, 0.8], 1), ([0.2], 2)])
def test_a_load_that_leaves_fewer_threads_is_measured_again(monkeypatch, restore_threads, loads, expected):
    """A spike in the first measurement (a process exiting) does not cost the run a thread; a
    load that stays does, and an idle machine is measured once."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    measured = iter(loads)
    monkeypatch.setattr(threads, "busy_cores", lambda interval=0.5: next(measured))
    line = threads.choose_threads("auto")
    assert torch.get_num_threads() == expected and f"({min(loads):.1f} busy" in line
    assert next(measured, None) is None  # every measurement was used, none more


def test_the_users_choice_wins(monkeypatch, restore_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(threads, "busy_cores", lambda interval=0.5: pytest.fail("OMP_NUM_THREADS was set: no measurement"))
    assert threads.choose_threads("auto").endswith("(OMP_NUM_THREADS=1)")
    assert threads.choose_threads(1) == "torch threads: 1 (threads: 1)" and torch.get_num_threads() == 1
    assert threads.choose_threads(None) is None
    for bad in (0, -2, "two"):
        with pytest.raises(ValueError, match="threads must be 'auto', a number >= 1 or null"):
            threads.choose_threads(bad)

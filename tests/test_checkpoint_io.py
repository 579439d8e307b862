"""Checkpoint writes that lose nothing: a kill -9 mid-write, a full disk, a read-only directory."""
from __future__ import annotations

import errno
import multiprocessing
import os
import random
import signal
import time

import pytest
import torch

from paw_lightning.cli import main
from paw_lightning.training import checkpoint_io
from paw_lightning.training.checkpoint_io import CheckpointWriteError, DurableCheckpointIO

from helpers import tiny_args, write_checkpoints_forever


@pytest.mark.slow
def test_kill_mid_write_leaves_a_whole_checkpoint(tmp_path):
    """A process rewriting a 32 MB checkpoint in a loop is killed (SIGKILL) at 10 random moments:
    every time, the file loads and is one whole version (its tensor all that version), and no
    temporary file is left but the interrupted one's. Each writer is a fork of one server process
    that imported torch and the checkpoint code once (a fresh interpreter each time spent ~3 s
    importing before its first write)."""
    path = tmp_path / "last.ckpt"
    rng = random.Random(0)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["helpers", "paw_lightning.training.checkpoint_io"])
    for attempt in range(10):
        ready = context.Event()
        proc = context.Process(target=write_checkpoints_forever, args=(str(path), ready), daemon=True)
        proc.start()
        assert ready.wait(timeout=300)
        while not path.is_file():
            assert proc.is_alive(), f"the writer exited with code {proc.exitcode}"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.5))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        saved = torch.load(path, weights_only=True)
        assert saved["version"] >= 1 and torch.equal(saved["weights"], torch.full((8_000_000,), float(saved["version"])))
        for leftover in tmp_path.glob(".last.ckpt.*.tmp"):
            leftover.unlink()  # the killed writer's half file (never read: it is not the checkpoint's name)


def test_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = DurableCheckpointIO()
    io.save_checkpoint({"epoch": 1}, path)

    def half_then_full(obj, f):
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_io.torch, "save", half_then_full)
    with pytest.raises(CheckpointWriteError, match=r"cannot write the checkpoint .*last.ckpt: No space left on device; earlier checkpoints are intact"):
        io.save_checkpoint({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"epoch": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_read_only_directory_is_one_clear_error(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(checkpoint_io, "open", read_only, raising=False)
    with pytest.raises(CheckpointWriteError, match=r"Read-only file system; earlier checkpoints are intact. Free disk space or make .*sub writable"):
        DurableCheckpointIO().save_checkpoint({"epoch": 1}, tmp_path / "sub" / "last.ckpt")


@pytest.mark.slow
def test_fit_stops_with_one_line_when_the_disk_fills(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The first epoch's checkpoints are written; at the second the disk is "full": the fit exits
    with code 1 and one error line, and last.ckpt still holds the first epoch."""
    real_save, calls = torch.save, []

    def save(obj, f):
        calls.append(obj.get("epoch"))
        if obj.get("epoch", 0) >= 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(obj, f)

    monkeypatch.setattr(checkpoint_io.torch, "save", save)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=2", "--trainer.check_val_every_n_epoch=2")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "error: cannot write the checkpoint" in err and "No space left on device; earlier checkpoints are intact" in err and "Traceback" not in err
    (last,) = tmp_path.glob("runs/**/last.ckpt")
    assert torch.load(last, weights_only=False)["epoch"] == 0

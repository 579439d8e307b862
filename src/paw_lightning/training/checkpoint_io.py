"""Checkpoint files that survive a kill or a full disk mid-write (the trainer's ``CheckpointIO``).

Each checkpoint is written to a temporary file beside it, flushed to disk (fsync), renamed over
the previous one (atomic on POSIX) and the directory entry synced, so at any moment the path
holds either the old checkpoint or the new one, whole; the half-written temporary file of a writer
that was killed is removed by the next successful save of that path. A failed write (disk full, read-only
directory) removes the temporary file and raises :class:`CheckpointWriteError`, one line naming
the path and the cause; the previous checkpoint stays. Remote paths (``s3://`` …) go to
Lightning's own writer.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the previous one is intact."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temporaries(path: Path) -> None:
    """Delete ``.<name>.<pid>.tmp`` files beside ``path`` left by writers that no longer run."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name.removeprefix(f".{path.name}.").removesuffix(".tmp")
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to a temporary file, fsync, rename (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_directory(path.parent)
            _remove_stale_temporaries(path)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise CheckpointWriteError(
                f"cannot write the checkpoint {path}: {err.strerror or err}; earlier checkpoints are intact. Free disk "
                f"space or make {path.parent} writable (or set trainer.default_root_dir), then resume with --ckpt_path"
            ) from err

"""When a collective fails in a multi-process run: which rank is gone, in one line.

A rank that dies (killed, out of memory) makes the others' next collective fail at once (gloo:
"Connection reset/closed by peer"); a rank that hangs makes it fail after the strategy's
collective ``timeout`` (default 30 min; ``--trainer.strategy.init_args.timeout=0:05:00`` sets it,
as ``h:m:s``). :func:`collective_failure` turns either error into :class:`PeerLostError`, whose
message names the rank: the launcher (rank 0 of a Lightning-launched run) knows its child ranks'
processes, a child rank knows its launcher (its parent process). Elsewhere (torchrun, several
nodes) the message says a peer stopped answering.

Rank 0 of a Lightning-launched run also has Lightning's child-process observer, a thread that
looks at the child ranks every 5 s and, when one has died, SIGKILLs every rank, itself
included (exit code −9, no message). Which of the two sees a dead rank first is a race, so
:func:`name_lost_ranks_on_observer_kill` makes the observer end rank 0 with the same one line
and exit code 1; :func:`report` prints that line once per process, whichever path comes first.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

import psutil

MARKERS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer", "timed out", "timeout")


class PeerLostError(RuntimeError):
    """A collective failed because another rank died or stopped answering."""


def is_collective_failure(err: BaseException, world_size: int) -> bool:
    """A ``torch.distributed`` error (or gloo/NCCL's RuntimeError) in a run of ``world_size`` processes."""
    import torch.distributed as dist

    if world_size < 2:
        return False
    return isinstance(err, getattr(dist, "DistError", ())) or (isinstance(err, RuntimeError) and any(m in str(err).lower() for m in MARKERS))


def _process_state(pid: int, returncode: int | None = None) -> str | None:
    """How the process ended or what it is doing, if it is not simply running; None if running."""
    if returncode is not None:
        return f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with code {returncode}"
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"
    return {psutil.STATUS_ZOMBIE: "dead", psutil.STATUS_STOPPED: "stopped (SIGSTOP)", psutil.STATUS_DEAD: "dead"}.get(status)


def lost_peers(rank: int, launched: list | None) -> list[str]:
    """Descriptions of the ranks that are gone: ``launched`` is a Lightning launcher's child
    processes (ranks 1…, on rank 0); on a child rank, the parent is rank 0."""
    found = []
    for local_rank, proc in enumerate(launched or [], start=1):
        state = _process_state(proc.pid, proc.poll())
        if state:
            found.append(f"rank {local_rank} (pid {proc.pid}) {state}")
    if not launched and rank > 0:
        parent = os.getppid()
        state = "gone" if parent == 1 else _process_state(parent)
        if state:
            found.append(f"rank 0 (pid {parent}) {state}")
    return found


def _resume(checkpoint: str | None) -> str:
    return f"resume with --ckpt_path={checkpoint}" if checkpoint else "no checkpoint was written yet: start again"


def collective_failure(err: BaseException, rank: int, world_size: int, launched: list | None, checkpoint: str | None) -> PeerLostError:
    """The one-line error of ``rank`` for a failed collective (see the module docstring)."""
    lost = lost_peers(rank, launched)
    who = "; ".join(lost) if lost else "a peer rank stopped answering"
    detail = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
    return PeerLostError(f"rank {rank} of {world_size}: a collective failed: {who} ({detail}); {_resume(checkpoint)}")


_REPORTED = threading.Lock()  # held once this process has printed its error line


def report(message: str) -> bool:
    """Print ``error: <message>`` to stderr unless this process already printed its error line;
    whether it printed."""
    if not _REPORTED.acquire(blocking=False):
        return False
    print(f"error: {message}", file=sys.stderr, flush=True)
    return True


def name_lost_ranks_on_observer_kill(checkpoint: Callable[[], str | None]) -> None:
    """Replace the observer that Lightning's subprocess launcher starts on rank 0 with one that,
    when a child rank has died, kills the other children as Lightning's does, then prints the
    one error line (the dead ranks, ``checkpoint()`` to resume from) and exits with code 1
    instead of SIGKILLing rank 0. If rank 0 already reported (its collective failed first), the
    observer leaves the exit to it."""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
    from lightning.pytorch.strategies.launchers import subprocess_script

    class NamingObserver(_ChildProcessObserver):
        def _terminate_all(self) -> None:
            lost = lost_peers(0, self._child_processes)
            for proc in self._child_processes:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
            who = "; ".join(lost) if lost else "a child rank ended"
            if report(f"rank 0 of {len(self._child_processes) + 1}: {who}; {_resume(checkpoint())}"):
                os._exit(1)

    subprocess_script._launch_process_observer = lambda procs: NamingObserver(main_pid=os.getpid(), child_processes=procs).start()

"""``EnvPool``: ``size`` environments stepped in batches, in-process or in worker processes.

``num_workers=0`` (default) steps them sequentially in this process; ``num_workers>0`` puts
environment ``i`` on "spawn" worker ``i % num_workers``, so the workers run in parallel.
Environments are built lazily at their first reset; results come back in request order.
Fault tolerance: an environment that raises, or returns a non-text observation or a non-finite
reward, ends that episode only (failed, ``info["error"]``) and is rebuilt at its next reset; an
observation over ``MAX_OBS_CHARS`` is cut (``info["obs_truncated_chars"]``: its length); a worker
that dies or times out is replaced and its episodes end failed. Every recovered failure is
logged as a warning.

"""
from __future__ import annotations

import logging
import math
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from paw_lightning.envs.base import EnvError, TextEnv

log = logging.getLogger(__name__)

StepResult = tuple[str, float, bool, dict]
_POLL_S = 0.05
MAX_OBS_CHARS = 8192  # an observation is cut here, before it reaches a pipe or a prompt (ALFWorld's are < 1k)


def checked(observation, info) -> tuple[str, dict]:
    """The environment's output as the protocol promises it: text (cut at ``MAX_OBS_CHARS``)
    and a dict; ``TypeError`` otherwise."""
    if not isinstance(observation, str):
        raise TypeError(f"the environment returned a {type(observation).__name__} observation, not text")
    if not isinstance(info, dict):
        raise TypeError(f"the environment returned a {type(info).__name__} info, not a dict")
    if len(observation) > MAX_OBS_CHARS:
        return observation[:MAX_OBS_CHARS], {**info, "obs_truncated_chars": len(observation)}
    return observation, info


def failed_result(error: str) -> StepResult:
    """The step result of an episode that ended because of an error."""
    info = {"won": False, "error": error, "task": "", "admissible_actions": [], "action_recognised": False}
    return "", 0.0, True, info


class _EnvHost:
    """Owns some environments and runs commands on them, turning exceptions into failed results."""

    def __init__(self, env_factory: Callable[[], TextEnv]) -> None:
        self.env_factory = env_factory
        self.envs: dict[int, TextEnv] = {}

    def run(self, command: str, items: list[tuple]) -> list[tuple]:
        return [self._reset(*item) if command == "reset" else self._step(*item) for item in items]

    def _reset(self, index: int, seed: int, episode: int) -> tuple[str, dict]:
        try:
            if index not in self.envs:
                self.envs[index] = self.env_factory()
            return checked(*self.envs[index].reset(seed, episode))
        except Exception as err:  # noqa: BLE001 - any env failure ends the episode
            self._drop(index)
            obs, _, _, info = failed_result(f"{type(err).__name__}: {err}")
            return obs, info

    def _step(self, index: int, action: str) -> StepResult:
        try:
            if index not in self.envs:
                raise EnvError(f"environment {index} has no running episode: call reset() first")
            observation, reward, done, info = self.envs[index].step(action)
            observation, info = checked(observation, info)
            if not math.isfinite(reward := float(reward)):
                raise ValueError(f"the environment returned a non-finite reward ({reward})")
            return observation, reward, bool(done), info
        except Exception as err:  # noqa: BLE001
            self._drop(index)
            return failed_result(f"{type(err).__name__}: {err}")

    def _drop(self, index: int) -> None:
        env = self.envs.pop(index, None)
        try:
            getattr(env, "close", lambda: None)()
        except Exception:  # noqa: BLE001 - a broken env may fail to close too
            pass

    def close(self) -> None:
        for index in list(self.envs):
            self._drop(index)


def _worker_main(conn: Connection, env_factory: Callable[[], TextEnv]) -> None:
    """Worker loop: receive ``(command, items)``, reply with the list of results."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the parent
    host = _EnvHost(env_factory)
    conn.send("ready")  # the factory unpickled: the worker is usable
    try:
        while True:
            try:
                command, items = conn.recv()
            except EOFError:
                break
            if command == "close":
                break
            conn.send(host.run(command, items))
    finally:
        host.close()
        conn.close()


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection


class EnvPool:
    """A pool of ``size`` environments built by ``env_factory`` (see the module docstring).

    ``timeout``: seconds to wait for the replies to one request (lazy env construction
    included) before killing and replacing the workers still silent (``None``: wait as long
    as they are alive). Ignored in-process.
    ``num_workers`` is capped at ``size``."""

    def __init__(
        self, env_factory: Callable[[], TextEnv], size: int, num_workers: int = 0, timeout: float | None = None
    ) -> None:
        if size < 1 or num_workers < 0:
            raise ValueError(f"EnvPool needs size >= 1 and num_workers >= 0, got {size} and {num_workers}")
        self.env_factory, self.size, self.timeout = env_factory, size, timeout
        self.num_workers = min(num_workers, size)
        self._closed = False
        self._host = _EnvHost(env_factory)
        self._lost: dict[int, str] = {}  # index -> error, for episodes lost with their worker
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        for _ in range(self.num_workers):
            self._workers.append(self._start_worker())
        for worker in self._workers:
            self._await_ready(worker)

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def __len__(self) -> int:
        return self.size

    def reset(self, index: int, seed: int, episode: int = 0) -> tuple[str, dict]:
        return self.reset_many([(index, seed, episode)])[0]

    def reset_many(self, items: list[tuple[int, int, int]]) -> list[tuple[str, dict]]:
        """Reset the environments ``(index, seed, episode)``; returns ``(observation, info)`` each."""
        for index, _, _ in items:
            self._lost.pop(index, None)
        return self._run("reset", items)

    def step(self, index: int, action: str) -> StepResult:
        return self.step_many([(index, action)])[0]

    def step_many(self, items: list[tuple[int, str]]) -> list[StepResult]:
        """Step the environments ``(index, action)``; returns ``(obs, reward, done, info)`` each."""
        return self._run("step", items)

    def _run(self, command: str, items: list[tuple]) -> list[tuple]:
        if self._closed:
            raise EnvError("the environment pool is closed")
        indices = [item[0] for item in items]
        if len(set(indices)) != len(indices):
            raise ValueError(f"an environment index appears twice in one request: {indices}")
        if any(not 0 <= i < self.size for i in indices):
            raise IndexError(f"environment index out of range 0..{self.size - 1}: {indices}")
        results: list[tuple | None] = [None] * len(items)
        if not self._workers:
            results = self._host.run(command, items)
        else:
            by_worker: dict[int, list[tuple[int, tuple]]] = {}
            for position, item in enumerate(items):
                if command == "step" and item[0] in self._lost:
                    results[position] = failed_result(self._lost.pop(item[0]))
                else:
                    by_worker.setdefault(item[0] % self.num_workers, []).append((position, item))
            self._dispatch(command, by_worker, results)
        for index, result in zip(indices, results):
            if "error" in result[-1]:
                log.warning("environment %d: %s failed, episode ended: %s", index, command, result[-1]["error"])
        return results

    def _dispatch(self, command: str, by_worker: dict[int, list[tuple[int, tuple]]], results: list) -> None:
        """Send each worker its items in one message, then gather every reply."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        sent = []
        for w, entries in by_worker.items():
            try:
                self._workers[w].conn.send((command, [item for _, item in entries]))
                sent.append(w)
            except OSError:  # broken pipe: the worker is gone
                self._replace_worker(w, entries, results, command, self._death_reason(w))
        for w in sent:
            reply, error = self._receive(w, deadline)
            if error is not None:
                self._replace_worker(w, by_worker[w], results, command, error)
                continue
            for (position, _), result in zip(by_worker[w], reply):
                results[position] = result

    def _receive(self, w: int, deadline: float | None) -> tuple[list | None, str | None]:
        """The worker's reply, or ``(None, error)`` once it is dead or past the deadline."""
        worker = self._workers[w]
        while True:
            try:
                if worker.conn.poll(_POLL_S):
                    return worker.conn.recv(), None
            except (EOFError, OSError):
                return None, self._death_reason(w)
            if not worker.process.is_alive():
                return None, self._death_reason(w)
            if deadline is not None and time.monotonic() > deadline:
                worker.process.kill()
                return None, f"worker process timed out after {self.timeout:g}s"

    def _death_reason(self, w: int) -> str:
        process = self._workers[w].process
        process.join(timeout=5)
        return f"worker process died (exit code {process.exitcode})"

    def _replace_worker(
        self, w: int, entries: list[tuple[int, tuple]], results: list, command: str, error: str
    ) -> None:
        """Fail the worker's requested episodes now, its other episodes at their next step,
        and start a fresh worker in its place."""
        failed = failed_result(error)
        for position, _ in entries:
            results[position] = failed if command == "step" else (failed[0], failed[3])
        requested = {item[0] for _, item in entries}
        for index in range(w, self.size, self.num_workers):
            if index not in requested:
                self._lost[index] = error
        log.warning("environment worker %d failed (%s); starting a fresh one", w, error)
        self._stop_worker(self._workers[w])
        self._workers[w] = self._start_worker()
        self._await_ready(self._workers[w])

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(child_conn, self.env_factory), daemon=True)
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    @staticmethod
    def _await_ready(worker: _Worker) -> None:
        """Wait for the worker's start-up message; ``EnvError`` if it dies first (e.g. the
        factory cannot be unpickled there because its class is not importable)."""
        while not worker.conn.poll(_POLL_S) and worker.process.is_alive():
            pass
        try:
            if worker.conn.recv() == "ready":
                return
        except (EOFError, OSError):
            pass
        worker.process.join(timeout=5)
        raise EnvError(f"environment worker failed to start (exit code {worker.process.exitcode})")

    @staticmethod
    def _stop_worker(worker: _Worker) -> None:
        try:
            if worker.process.is_alive():
                worker.conn.send(("close", None))
                worker.process.join(timeout=2)
        except OSError:
            pass
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=2)
        worker.conn.close()

    def close(self) -> None:
        """Close every environment and stop the workers (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._host.close()
        for worker in self._workers:
            self._stop_worker(worker)
        self._workers = []

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

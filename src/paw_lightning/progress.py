"""A small rich progress bar for long loops outside Lightning's own bar (rollouts, warm-up)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class _Bar:
    def __init__(self, progress: Progress | None, task=None):
        self.progress, self.task = progress, task

    def advance(self, n: int = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)


@contextmanager
def progress_bar(description: str, total: int, unit: str, enabled: bool = True) -> Iterator[_Bar]:
    """``with progress_bar("rollout 3", 16, "episodes") as bar: … bar.advance()``; a no-op when
    not ``enabled`` (e.g. on ranks other than 0). The bar disappears when the loop ends."""
    if not enabled:
        yield _Bar(None)
        return
    columns = (TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        yield _Bar(progress, progress.add_task(description, total=total))

"""The progress bar of the commands that score: on stderr, only when it is a terminal."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

__all__ = ["progress_bar", "Update"]

# update(done, total, name): what the library's ``progress=`` callbacks receive.
Update = Callable[[int, Optional[int], str], None]


@contextmanager
def progress_bar(enabled: bool, what: str = "scoring", unit: str = "matrices", *,
                 console: Any = None) -> Iterator[Optional[Update]]:
    """A transient bar with the count done of the total, the rate and the time left; None when
    stderr is not a terminal (nothing is drawn into a pipe or a log). ``console``: a rich Console
    to draw on instead of stderr's (tests draw on a forced terminal)."""
    if not enabled or (console is None and not sys.stderr.isatty()):
        yield None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from wbfe.errors import printable

    rate = TextColumn("{task.fields[rate]}")
    # A tensor's name is shown as it is: not read as rich markup ("a[/b].weight" raised MarkupError), its
    # control characters escaped (an escape sequence in a name would drive the terminal).
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TaskProgressColumn(), rate, TimeElapsedColumn(), TimeRemainingColumn(), console=console or Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None, rate="")

        def update(done: int, total: Optional[int], name: str) -> None:
            speed: Any = bar.tasks[0].speed
            shown = f"{speed:.1f} {unit}/s" if speed else ""
            # Before the first matrix the name says what is under way ("reading the model's description").
            name = printable(name)
            label = f"{what}: {name}" if done == 0 and total is None and name else f"{what} {name[:40]:<40}"
            bar.update(task, completed=done, total=total, rate=shown, description=label)
            bar.refresh()  # drawn at each matrix: the 0/N start shows before the first one is done

        yield update

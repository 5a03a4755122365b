"""Showing a pull, push or create progress stream on the terminal (stderr), as Ollama does: a
bar per blob for records with a digest and a total, other statuses as lines."""

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

_COLUMNS = (
    TextColumn("{task.description}"),
    BarColumn(),
    DownloadColumn(),
    TransferSpeedColumn(),
    TimeRemainingColumn(),
)


def show_progress(records: Iterable[dict[str, Any]], console: Console | None = None) -> None:
    """Consumes `records` (CLIError from the client ends it) and draws them in their order: the
    bars in view are closed before a status line, so it never lands above them."""
    console = console or Console(stderr=True)
    progress: Progress | None = None
    bars: dict[str, TaskID] = {}
    try:
        for record in records:
            status = str(record.get("status", ""))
            digest, total = record.get("digest"), record.get("total")
            if digest and isinstance(total, int) and total > 0:
                if progress is None:
                    progress = Progress(*_COLUMNS, console=console, transient=False)
                    progress.start()
                    bars = {}
                if digest not in bars:
                    bars[digest] = progress.add_task(status, total=total)
                done = record.get("completed") or 0
                progress.update(bars[digest], completed=done, description=status)
            elif status:
                if progress is not None:
                    progress.stop()  # leaves the bars drawn where they are
                    progress = None
                console.print(status, highlight=False, soft_wrap=True)
    finally:
        if progress is not None:
            progress.stop()

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


def show_progress(records: Iterable[dict[str, Any]], console: Console | None = None) -> None:
    """Consumes `records` (CLIError from the client ends it) and draws them."""
    console = console or Console(stderr=True)
    bars: dict[str, TaskID] = {}
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        for record in records:
            status = str(record.get("status", ""))
            digest, total = record.get("digest"), record.get("total")
            if digest and isinstance(total, int) and total > 0:
                done = record.get("completed") or 0
                if digest not in bars:
                    bars[digest] = progress.add_task(status, total=total)
                progress.update(bars[digest], completed=done, description=status)
            elif status:
                progress.console.print(status, highlight=False)

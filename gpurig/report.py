"""Console output shared by the tasks (rich): one console, lines never wrapped mid-path."""

from __future__ import annotations

from rich.console import Console

console = Console(highlight=False, soft_wrap=True)

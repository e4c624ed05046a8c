"""Placeholder: filled in by the Updates work (issue 22)."""

__all__: list[str] = []

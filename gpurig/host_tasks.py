"""Invoke tasks that act on hosts from the inventory (facts, ...)."""

from __future__ import annotations

__all__: list[str] = []

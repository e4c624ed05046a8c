"""Invoke entry point: ``invoke --list``. A thin layer; all logic lives in gpurig/."""

from pathlib import Path

from gpurig.cli import build_collection

ns = build_collection()
# `invoke` finds this file from any subdirectory; the project is where it lies.
ns.configure({"root": str(Path(__file__).resolve().parent)})

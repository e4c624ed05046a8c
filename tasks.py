"""Invoke entry point: ``invoke --list``. A thin layer; all logic lives in gpurig/."""

from gpurig.cli import build_collection

ns = build_collection()

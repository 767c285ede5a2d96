"""Errors of the speculative-decoding lab."""

from __future__ import annotations


class LabError(ValueError):
    """Bad lab input (workload, drafter, k range, tree shape, policy): raised before any generation
    runs."""

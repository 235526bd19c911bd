"""Choosing the delta base of a new checkpoint (see docs/DELTA.md)."""

from __future__ import annotations


def choose_base(fs, path: str, previous):
    """The manifest a new version of ``path`` should be coded against, or None."""
    return previous if previous is not None and previous.kind != "raw" else None

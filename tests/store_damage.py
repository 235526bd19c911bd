"""Damage done to a store behind s4fs's back, for the tests of what a save does next."""

from __future__ import annotations


def damage_packs(store, keys, how: str) -> None:
    """Delete the packs ``keys`` from ``store`` (``how="missing"``), or zero 64 bytes in
    the middle of each (``"corrupt"``)."""
    for key in keys:
        if how == "missing":
            store.delete(key)
        else:
            raw = bytearray(store.get(key))
            raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(64)
            store.put(key, bytes(raw))

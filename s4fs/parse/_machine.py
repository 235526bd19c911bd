"""The base of the per-format state machines driven by :class:`StreamParser`.

A machine's ``state`` is a bound method that looks at the window and either makes
progress (takes bytes or moves to another state: returns True) or needs more input
(returns False). Every loop back to an earlier state takes at least one byte, so driving
``while machine.step(): pass`` always ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._window import RAW, TensorSpec, Window


@dataclass(frozen=True)
class ParserLimits:
    """How much a parser may hold back in memory at once."""

    record_cap: int = 64 << 20      # data.pkl or any record whose size must be searched for
    header_cap: int = 64 << 20      # a safetensors JSON header


class Machine:
    format = "raw"

    def __init__(self, win: Window, limits: ParserLimits) -> None:
        self.win = win
        self.limits = limits
        self.state = self._st_rest_raw
        self._left = 0
        self._spec: TensorSpec | None = RAW
        self._then = self._st_rest_raw

    def step(self) -> bool:
        return self.state()

    def names(self) -> dict[str, str]:
        return {}

    def payload(self, length: int, spec: TensorSpec | None, then) -> bool:
        """Take ``length`` bytes as ``spec`` (streamed as they arrive), then go to ``then``."""
        self._left, self._spec, self._then = length, spec, then
        self.state = self._st_payload
        return True

    def rest_raw(self) -> bool:
        self.state = self._st_rest_raw
        return True

    def _st_payload(self) -> bool:
        if self._left > 0:
            self._left -= self.win.take(self._left, self._spec)
            if self._left > 0:
                return False
        self.state = self._then
        return True

    def _st_rest_raw(self) -> bool:
        self.win.take(self.win.avail, RAW)
        return False

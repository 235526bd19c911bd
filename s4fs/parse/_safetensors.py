"""safetensors: an 8-byte little-endian header length, a JSON header, then the data.

Each tensor's ``data_offsets`` are relative to the end of the header. Tensors become
segments in offset order; the length prefix, the header and any gap are raw. Entries
that overlap an earlier one, are empty, or whose size is not a whole number of elements
are left to the raw gap: the header may lie, the bytes still round-trip.
"""

from __future__ import annotations

import json
import struct

from ._machine import Machine
from ._pickle_scan import itemsize
from ._window import RAW, TensorSpec

# safetensors dtype names -> s4fs.codec dtype names
DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool", "C64": "complex64", "C128": "complex128",
}


def looks_like(head: bytes, header_cap: int) -> bool:
    """Whether the first 9 bytes of a stream start a safetensors file."""
    if len(head) < 9:
        return False
    n = struct.unpack_from("<Q", head)[0]
    return 2 <= n <= header_cap and head[8:9] == b"{"


def plan(header: dict) -> list[tuple[int, int, str, str]]:
    """(begin, end, name, dtype) of the tensors to classify, in offset order."""
    found = []
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offs = entry.get("data_offsets")
        dt = entry.get("dtype")
        if not (isinstance(offs, list) and len(offs) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            continue
        begin, end = offs
        if not 0 <= begin < end:
            continue
        dtype = DTYPES.get(dt, "bytes") if isinstance(dt, str) else "bytes"
        if (end - begin) % itemsize(dtype):
            continue
        found.append((begin, end, name, dtype))
    found.sort(key=lambda t: (t[0], t[1]))
    out, pos = [], 0
    for t in found:
        if t[0] >= pos:
            out.append(t)
            pos = t[1]
    return out


class SafetensorsMachine(Machine):
    format = "safetensors"

    def __init__(self, win, limits) -> None:
        super().__init__(win, limits)
        self._header_len = 0
        self._plan: list[tuple[int, int, str, str]] = []
        self._next = 0
        self._pos = 0        # offset in the data section of the next byte to take
        self.state = self._st_length

    def names(self) -> dict[str, str]:
        return {name: name for _, _, name, _ in self._plan}

    def _st_length(self) -> bool:
        h = self.win.peek(8)
        if h is None:
            return False
        self._header_len = struct.unpack("<Q", h)[0]
        if self._header_len > self.limits.header_cap:
            return self.rest_raw()
        return self.payload(8, RAW, self._st_header)

    def _st_header(self) -> bool:
        raw = self.win.peek(self._header_len)
        if raw is None:
            return False
        try:
            header = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            header = None
        if not isinstance(header, dict):
            return self.rest_raw()
        self._plan = plan(header)
        return self.payload(self._header_len, RAW, self._st_tensor)

    def _st_tensor(self) -> bool:
        if self._next >= len(self._plan):
            return self.rest_raw()
        begin, end, name, dtype = self._plan[self._next]
        if self._pos < begin:
            gap, self._pos = begin - self._pos, begin
            return self.payload(gap, RAW, self._st_tensor)
        self._next += 1
        self._pos = end
        return self.payload(end - begin, TensorSpec(dtype, name, end - begin), self._st_tensor)

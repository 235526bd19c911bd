"""Does a file of a known format look complete? (Used to decide whether a ``flush`` that
may come from any descriptor — a forked child's, a ``dup``'d one — may commit the file.)

Looks only at a few bytes of the head and the tail, read through ``pread(offset, n)``:

* torch-zip (and any zip): the file ends with an end-of-central-directory record whose
  comment reaches exactly the end of the file. torch writes that record last, so a file
  cut anywhere before the end of ``torch.save`` does not end with one (a tensor's bytes
  would have to end in that exact 22-byte pattern).
* safetensors: the file is at least as long as its header says (8 + header length +
  the largest ``data_offsets`` end).
* anything else: complete whenever asked (there is nothing to tell a prefix apart) —
  once it has the 9 bytes that decide the format: a shorter file may be the start of
  either (an empty file just created, a checkpoint whose first write is not there yet).
"""

from __future__ import annotations

import json
import struct
from typing import Callable

from s4fs.parse.layout import END, END_FIXED, LOCAL

from ._safetensors import looks_like

_MAX_COMMENT = 0xFFFF
_HEADER_CAP = 100 << 20


def looks_complete(pread: Callable[[int, int], bytes], size: int) -> bool:
    """Whether the ``size`` bytes readable through ``pread`` form a whole file of their
    format; ``True`` for formats that cannot tell."""
    if size < 9:
        return False
    head = pread(0, 9)
    if head[:4] == LOCAL:
        return _zip_complete(pread, size)
    if looks_like(head, _HEADER_CAP):
        return _safetensors_complete(pread, size)
    return True


def _zip_complete(pread, size: int) -> bool:
    if size < END_FIXED.size:
        return False
    span = min(size, END_FIXED.size + _MAX_COMMENT)
    tail = pread(size - span, span)
    pos = tail.rfind(END)
    while pos >= 0:
        if len(tail) - pos >= END_FIXED.size:
            comment = END_FIXED.unpack_from(tail, pos)[-1]
            if pos + END_FIXED.size + comment == len(tail):
                return True
        pos = tail.rfind(END, 0, pos)
    return False


def _safetensors_complete(pread, size: int) -> bool:
    n = struct.unpack("<Q", pread(0, 8))[0]
    if size < 8 + n:
        return False
    try:
        header = json.loads(pread(8, n))
    except (ValueError, UnicodeDecodeError):
        return True                  # not really safetensors: nothing to wait for
    end = 0
    if isinstance(header, dict):
        for entry in header.values():
            offs = entry.get("data_offsets") if isinstance(entry, dict) else None
            if isinstance(offs, list) and len(offs) == 2 and all(
                    isinstance(o, int) for o in offs):
                end = max(end, offs[1])
    return size >= 8 + n + end

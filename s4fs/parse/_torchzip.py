"""The torch zip archive as torch 2.x writes it, parsed as it streams past.

Facts this relies on (torch 2.13, checked by experiment; DESIGN §10):

* local headers have flag bit 3 and no sizes or CRC; a data descriptor follows each
  payload: ``PK\\x07\\x08``, CRC-32, sizes (16 bytes, or 24 in zip64 form). Empty records
  carry sizes (zero) instead and have no descriptor;
* a record of 4 GiB or more has a zip64 extra field holding its sizes (the 32-bit fields
  stay zero); a record that starts past 4 GiB has a zip64 extra field holding only its
  header offset. Either way its descriptor is the 24-byte zip64 form;
* ``data.pkl`` comes first; its persistent ids give every ``data/<key>`` record's size;
* the name prefix (``ckpt_100/``, ``archive/``) differs between checkpoints; segment names
  drop it, and later archives of a back-to-back stream (DCP ``.distcp``) are told apart
  by a ``"<n>:"`` prefix.

Records of unknown size (``data.pkl`` and the small ones) are held until a descriptor
whose sizes and CRC-32 match the bytes seen is found. Anything that does not fit (a
descriptor where none is, sizes that disagree) makes the machine hunt for the next zip
signature and carry on from there; bytes it passes over are raw.
"""

from __future__ import annotations

import struct
import zlib

from s4fs.parse.layout import (CENTRAL, CENTRAL_FIXED, DESCRIPTOR, DESCRIPTOR_CRC_AT, END,
                               END_FIXED, LOCAL, LOCAL_FIXED, ZIP64_END, ZIP64_LOCATOR,
                               ZIP64_LOCATOR_LEN, central_entry_length)

from ._machine import Machine
from ._pickle_scan import StorageInfo, itemsize, scan_pickle
from ._window import RAW, TensorSpec

_DESCRIPTOR_TAIL = frozenset((DESCRIPTOR[2:],))
_SYNC_TAILS = frozenset(sig[2:] for sig in (LOCAL, CENTRAL, ZIP64_END, ZIP64_LOCATOR, END))
_U32 = 0xFFFFFFFF
_DESC_LOOKAHEAD = 24            # enough to tell a 16-byte descriptor from a 24-byte one
_SEARCH_LOOKAHEAD = 26          # ... and see the signature after a 24-byte one


class _Archive:
    """What is known about the archive being parsed (one per back-to-back zip)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.prefix: str | None = None
        self.storages: dict[str, StorageInfo] = {}
        self.pickle_seen = False

    def segment_name(self, rel: str) -> str:
        return rel if self.number == 0 else f"{self.number}:{rel}"


def zip64_field(extra: bytes) -> bytes | None:
    """The payload of the zip64 extended-information extra field (tag 1), if any."""
    off = 0
    while off + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, off)
        if tag == 1:
            return extra[off + 4:off + 4 + size]
        off += 4 + size
    return None


def descriptor_length(d: bytes, size: int, method: int, zip64_first: bool) -> int:
    """16 or 24 if ``d`` starts with a data descriptor for ``size`` payload bytes; else 0."""
    if len(d) < 16 or d[:4] != DESCRIPTOR:
        return 0
    for n in ((24, 16) if zip64_first else (16, 24)):
        if len(d) < n:
            continue
        c, u = struct.unpack_from("<QQ" if n == 24 else "<II", d, 8)
        if c == size and (method != 0 or u == size):
            return n
    return 0


class TorchZipMachine(Machine):
    format = "torch-zip"

    def __init__(self, win, limits) -> None:
        super().__init__(win, limits)
        self.archive = _Archive(0)
        self._ended = False            # an end-of-central-directory record was passed
        self._names: dict[str, str] = {}
        self._hunt_from = 0
        # the record being parsed
        self._method = 0
        self._size = 0
        self._zip64 = False
        self._is_pickle = False
        self._search_from = 0
        self.state = self._st_signature

    def names(self) -> dict[str, str]:
        return dict(self._names)

    # -- between records -------------------------------------------------------------

    def hunt(self, start: int) -> bool:
        self._hunt_from = start
        self.state = self._st_hunt
        return True

    def _st_hunt(self) -> bool:
        win = self.win
        i = win.search(_SYNC_TAILS, self._hunt_from)
        if i < 0:
            n = win.avail - 3
            if n > 0:
                win.take(n, RAW)
                self._hunt_from = 0
            return False
        win.take(i, RAW)
        self._hunt_from = 0
        self.state = self._st_signature
        return True

    def _st_signature(self) -> bool:
        sig = self.win.peek(4)
        if sig is None:
            return False
        if sig == LOCAL:
            self.state = self._st_local
        elif sig == CENTRAL:
            self.state = self._st_central
        elif sig == ZIP64_END:
            self.state = self._st_zip64_end
        elif sig == ZIP64_LOCATOR:
            return self.payload(ZIP64_LOCATOR_LEN, RAW, self._st_signature)
        elif sig == END:
            self.state = self._st_end
        else:
            return self.hunt(1)
        return True

    def _st_central(self) -> bool:
        h = self.win.peek(CENTRAL_FIXED.size)
        if h is None:
            return False
        return self.payload(central_entry_length(h), RAW, self._st_signature)

    def _st_zip64_end(self) -> bool:
        h = self.win.peek(12)
        if h is None:
            return False
        size = struct.unpack_from("<Q", h, 4)[0]
        if not 44 <= size <= 1 << 20:
            return self.hunt(1)
        return self.payload(12 + size, RAW, self._st_signature)

    def _st_end(self) -> bool:
        h = self.win.peek(END_FIXED.size)
        if h is None:
            return False
        *_, on_disk, total, _, _, comment = END_FIXED.unpack(h)
        if on_disk != total:
            return self.hunt(1)
        return self.payload(END_FIXED.size + comment, RAW, self._st_after_end)

    def _st_after_end(self) -> bool:
        self._ended = True
        self.state = self._st_signature
        return True

    # -- a record --------------------------------------------------------------------

    # long on purpose: one state of the streaming zip parser, a local record's fields
    # read and checked in their order
    def _st_local(self) -> bool:
        win = self.win
        fixed = win.peek(LOCAL_FIXED.size)
        if fixed is None:
            return False
        _, _, flags, method, _, _, _, csize, usize, nlen, elen = LOCAL_FIXED.unpack(fixed)
        if flags & 1 or nlen == 0 or method > 99:
            return self.hunt(1)
        head = win.peek(LOCAL_FIXED.size + nlen + elen)
        if head is None:
            return False
        try:
            name = head[LOCAL_FIXED.size:LOCAL_FIXED.size + nlen].decode("utf-8")
        except UnicodeDecodeError:
            return self.hunt(1)
        z64 = zip64_field(head[LOCAL_FIXED.size + nlen:])
        described = bool(flags & 8)

        size = None
        if z64 is not None and len(z64) >= 16:
            c = struct.unpack_from("<Q", z64, 8)[0]
            if c or not described:
                size = c
        elif z64 is not None and len(z64) >= 8 and usize == _U32:
            size = struct.unpack_from("<Q", z64)[0]
        if size is None and csize != _U32 and (csize or not described):
            size = csize

        if self._ended:
            self.archive = _Archive(self.archive.number + 1)
            self._ended = False
        arch = self.archive
        if arch.prefix is None:
            if name.endswith("data.pkl"):
                arch.prefix = name[:-len("data.pkl")]
            else:
                arch.prefix = name[:name.index("/") + 1] if "/" in name else ""
        rel = name[len(arch.prefix):] if name.startswith(arch.prefix) else name

        win.take(len(head), RAW)
        self._method, self._zip64 = method, z64 is not None
        after = self._st_descriptor if described else self._st_signature

        self._is_pickle = rel == "data.pkl" and not arch.pickle_seen and method == 0
        if self._is_pickle:
            arch.pickle_seen = True
            if size is None:
                return self.search()
            if size > self.limits.record_cap:
                return self.rest_raw()
            self._size = size
            self._then = after
            self.state = self._st_known_pickle
            return True

        if method == 0 and rel.startswith("data/"):
            info = arch.storages.get(rel[5:])
            if info is not None:
                length = info.nbytes if size is None else size
                self._size = length
                if length % itemsize(info.dtype) == 0:
                    spec = TensorSpec(info.dtype, arch.segment_name(rel), length)
                    return self.payload(length, spec, after)
                return self.payload(length, RAW, after)
        if size is None:
            return self.search()
        self._size = size
        return self.payload(size, RAW, after)

    def _st_descriptor(self) -> bool:
        d = self.win.peek(_DESC_LOOKAHEAD)
        if d is None:
            return False
        n = descriptor_length(d, self._size, self._method, self._zip64)
        if not n:
            return self.hunt(0)       # the sizes we were given were wrong: resynchronise
        return self.payload(n, RAW, self._st_signature)

    def _st_known_pickle(self) -> bool:
        data = self.win.peek(self._size)
        if data is None:
            return False
        self._scanned(data)
        return self.payload(self._size, RAW, self._then)

    # -- records of unknown size -----------------------------------------------------

    def search(self) -> bool:
        self._search_from = 0
        self.state = self._st_search
        return True

    def _st_search(self) -> bool:
        win, cap = self.win, self.limits.record_cap
        while True:
            p = win.search(_DESCRIPTOR_TAIL, self._search_from)
            if p < 0 or p > cap:
                self._search_from = max(self._search_from, win.avail - 3)
                if win.avail < cap + _SEARCH_LOOKAHEAD:
                    return False
                # no descriptor within the cap: too big to hold, give up on this record
                return self.rest_raw() if self._is_pickle else self.hunt(0)
            if not win.ensure(p + _SEARCH_LOOKAHEAD):
                self._search_from = p
                return False
            n = self._found(win.held, p)
            if n:
                if self._is_pickle:
                    self._scanned(bytes(win.held[:p]))
                return self.payload(p + n, RAW, self._st_signature)
            self._search_from = p + 1

    def _found(self, held: bytearray, p: int) -> int:
        """Length of the descriptor at ``p`` if it closes a ``p``-byte record, else 0.

        Decided from the ``_SEARCH_LOOKAHEAD`` bytes at ``p`` only, so that how the
        stream was split never changes the answer."""
        d = bytes(held[p:p + _DESC_LOOKAHEAD])
        n = descriptor_length(d, p, self._method, False)
        if not n:
            return 0
        if self._method == 0:
            crc = struct.unpack_from("<I", d, DESCRIPTOR_CRC_AT)[0]
            return n if zlib.crc32(held[:p]) == crc else 0
        return n if held[p + n:p + n + 2] == b"PK" else 0     # no CRC to check: a header

    def _scanned(self, data: bytes) -> None:
        scan = scan_pickle(data)
        arch = self.archive
        arch.storages = scan.storages
        for key, human in scan.names.items():
            if key in scan.storages:
                self._names[arch.segment_name("data/" + key)] = human

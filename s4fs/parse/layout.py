"""The zip records torch 2.x writes, in one place: the stream parser (this package) and
the direct save (``s4fs.torch.save``, which fills in a layout torch made) read and patch
the same fields. It lives with the parser, the lower of the two: the save imports it.

torch writes, per record, a local header (flag bit 3: CRC-32 and sizes left zero) and the
payload, then a data descriptor (``DESCRIPTOR``, CRC-32, sizes: 16 bytes, or 24 in zip64
form); an empty record carries its (zero) sizes in the header and has no descriptor.
Then the central directory (one entry per record, its CRC-32 again), the zip64 end
records when needed, and the end-of-central-directory record, last.
"""

from __future__ import annotations

import bisect
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field

from s4fs.errors import S4Error


class Unsupported(S4Error):
    """This object or call cannot take the direct path; the caller streams instead
    (``s4fs.torch`` hands it on under the same name)."""

LOCAL = b"PK\x03\x04"
CENTRAL = b"PK\x01\x02"
DESCRIPTOR = b"PK\x07\x08"
ZIP64_END = b"PK\x06\x06"
ZIP64_LOCATOR = b"PK\x06\x07"
END = b"PK\x05\x06"

# signature, version, flags, method, time, date, CRC-32, compressed size, size,
# name length, extra length
LOCAL_FIXED = struct.Struct("<4sHHHHHIIIHH")
# signature, made by, version, flags, method, time, date, CRC-32, compressed size, size,
# name length, extra length, comment length, disk, internal and external attributes,
# local header offset
CENTRAL_FIXED = struct.Struct("<4sHHHHHHIIIHHHHHII")
# signature, disk, directory's disk, entries on this disk, entries, directory size,
# directory offset, comment length
END_FIXED = struct.Struct("<4sHHHHIIH")
ZIP64_LOCATOR_LEN = 20
DESCRIPTOR_CRC_AT = 4           # a descriptor's CRC-32, after its signature
CENTRAL_CRC_AT = 16             # a central directory entry's CRC-32
_CRC = struct.Struct("<I")
_M64 = (1 << 64) - 1


def local_header_length(fixed: bytes) -> int:
    """Bytes of a local header (fixed part, name, extra field), from its fixed part."""
    *_, nlen, elen = LOCAL_FIXED.unpack_from(fixed)
    return LOCAL_FIXED.size + nlen + elen


def central_entry_length(fixed: bytes) -> int:
    """Bytes of a central directory entry (fixed part, name, extra field, comment)."""
    f = CENTRAL_FIXED.unpack_from(fixed)
    return CENTRAL_FIXED.size + f[10] + f[11] + f[12]


@dataclass
class Record:
    name: str                # inside the archive folder, e.g. "data/3"
    header: int              # local header offset
    data: int                # first data byte
    size: int
    crc: int
    central: int             # offset of its central directory entry
    descriptor: int | None   # offset of its data descriptor (None: no data)


@dataclass
class Layout:
    """A torch file as torch lays it out: host pieces (every byte that is not storage
    data) and the storages, in file order."""
    size: int
    records: list[Record]
    storages: list           # torch.UntypedStorage per key "0", "1", ... (key order)
    storage_records: list[Record]
    host: list[tuple[int, bytearray]] = field(default_factory=list)   # (file offset, bytes)

    def __post_init__(self) -> None:
        self._starts = [o for o, _ in self.host]

    def patch(self, off: int, data: bytes) -> None:
        i = bisect.bisect_right(self._starts, off) - 1
        start, buf = self.host[i]
        if off + len(data) > start + len(buf):
            raise S4Error("internal error: a zip field to patch straddles a storage")
        buf[off - start: off - start + len(data)] = data

    def read(self, off: int, n: int) -> bytes:
        i = bisect.bisect_right(self._starts, off) - 1
        start, buf = self.host[i]
        return bytes(buf[off - start: off - start + n])

    def pieces(self):
        """(file offset, ("host", bytes) | ("storage", index)) in file order."""
        out = [(o, ("host", b)) for o, b in self.host]
        out += [(r.data, ("storage", i)) for i, r in enumerate(self.storage_records)
                if r.size]
        return sorted(out, key=lambda x: x[0])


def read_layout(path: str, storages: list) -> Layout:
    """The layout of the torch file at ``path`` (storage bytes may be holes), whose
    storages, in key order, are ``storages``."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            start_dir = z.start_dir
        records: list[Record] = []
        cd = start_dir
        for info in infos:
            data = info.header_offset + local_header_length(
                os.pread(fd, LOCAL_FIXED.size, info.header_offset))
            ent = os.pread(fd, CENTRAL_FIXED.size, cd)
            if ent[:4] != CENTRAL:
                raise Unsupported("an unexpected zip central directory")
            desc = None
            if info.file_size:
                desc = data + info.file_size
                if os.pread(fd, 4, desc) != DESCRIPTOR:
                    raise Unsupported("a zip record without a data descriptor")
            rel = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
            records.append(Record(rel, info.header_offset, data, info.file_size, info.CRC, cd,
                                  desc))
            cd += central_entry_length(ent)
        by_name = {r.name: r for r in records}
        for key, st in enumerate(storages):
            r = by_name.get(f"data/{key}")
            if r is None or r.size != st.nbytes():
                raise Unsupported("torch's storage records do not match the storages seen")
        if sum(1 for r in records if r.name.startswith("data/")) != len(storages):
            raise Unsupported("torch wrote storage records s4fs did not see")
        srecs = [by_name[f"data/{k}"] for k in range(len(storages))]
        holes = sorted((r.data, r.data + r.size) for r in srecs if r.size)
        host, pos = [], 0
        for lo, hi in holes + [(size, size)]:
            if lo > pos:
                host.append((pos, bytearray(os.pread(fd, lo - pos, pos))))
            pos = max(pos, hi)
        return Layout(size, records, storages, srecs, host)
    finally:
        os.close(fd)


def _patch_crc(lay: Layout, r: Record) -> None:
    lay.patch(r.descriptor + DESCRIPTOR_CRC_AT, _CRC.pack(r.crc))
    lay.patch(r.central + CENTRAL_CRC_AT, _CRC.pack(r.crc))


def finish_layout(lay: Layout, crcs: list[int]) -> None:
    """Write the storages' CRC-32s into the zip fields and the serialization id."""
    for r, c in zip(lay.storage_records, crcs):
        r.crc = c
        if r.descriptor is not None:
            _patch_crc(lay, r)
    sid = next((r for r in lay.records if r.name == ".data/serialization_id"), None)
    if sid is None:
        return
    old = lay.read(sid.data, sid.size)
    if len(old) != 40 or not old.isdigit():
        raise Unsupported("an unknown serialization id form")
    seed = 0
    for r in sorted(lay.records, key=lambda r: r.header):
        if r is sid or not r.size:
            continue
        seed ^= (r.crc + 0x9E3779B9 + ((seed << 6) & _M64) + (seed >> 2)) & _M64
        seed &= _M64
    new = old[:20] + b"%020d" % seed
    lay.patch(sid.data, new)
    sid.crc = zlib.crc32(new)
    _patch_crc(lay, sid)

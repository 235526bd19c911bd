"""GPU decoder: many blobs decoded with a few launches, the encoder's steps backwards.

The stages of one ``decompress_many`` call (methods of ``_Decode``, named as in the
benchmark's stage table):

* headers — every container header (``codec._container`` parses it) and nvCOMP payload
  table, checked (blobs on the device: two small reads); planes of CPU codecs (zstd)
  and layouts without a kernel decoded on the host;
* stage in — host blobs, host-decoded planes and host bases up in one overlapped copy;
* raw planes / nvcomp — ``restore_planes``: raw planes copied and constant planes filled
  in one launch each, every nvCOMP chunk gathered to aligned addresses and decoded in
  one batch per codec configuration (what its payload records: ``spec_for``);
* merge — ``merge_planes``: planes merged into the outputs, XOR-ing delta bases back in;
* checksum — XXH3 of every output checked on the device against its header;
* copy out — outputs stay on the device or come back in one copy to pinned memory.

``restore_planes`` and ``merge_planes`` are also the encoder's self-check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s4fs.errors import (
    BaseMismatchError,
    ChecksumError,
    CodecError,
    FormatError,
    UnsupportedVersionError,
)

from .. import _container as C
from .. import _plane_codecs as P
from .. import _planes
from .._dtypes import DType, from_code
from . import _codecs, _payload
from . import _kernels as K
from ._backend import CodecSpec, round_up
from ._common import (
    ALIGN,
    CODEC_NAMES,
    Segments,
    Staging,
    descriptors,
    download_ranges,
    finish,
    hash_buffers,
    launch_planes,
    place,
    plan,
    resolve,
)

PREFIX = 512            # bytes read back to parse the header of a blob on the device


@dataclass
class _Src:
    cid: int
    major: int
    pos: int                   # payload offset in its blob
    enc: int
    head: _payload.PayloadHeader | None = None
    host: bytes | None = None  # decoded on the host (CPU codecs)


def decompress_many(blobs, bases=None, *, out: str = "bytes", verify: bool = True,
                    backend=None, planes_only: bool = False, timer=None) -> list:
    """Decode many blobs; see ``s4fs.codec.gpu.decompress_many``.

    ``planes_only``: merge the planes and return them without XOR-ing a base or checking
    the checksum (what ``s4fs.codec.decompress`` wants: it does both itself).
    """
    from ._backend import cuda_backend
    if out not in ("bytes", "host", "device", "check"):
        raise CodecError(f"out must be 'bytes', 'host' or 'device', not {out!r}")
    blobs = list(blobs)
    bases = list(bases) if bases is not None else [None] * len(blobs)
    if len(bases) != len(blobs):
        raise CodecError("pass one base (or None) per blob")
    if not blobs:
        return []
    run = _Decode(backend or cuda_backend(), blobs, bases, planes_only, timer)
    run.headers()
    run.stage_in()
    run.restore()
    run.merge()
    if out == "check":          # the encoder's self-check: which blobs restore exactly
        return run.verify(report=True)
    if verify and not planes_only:
        run.verify()
    return run.hand_out(out)


class _Decode:
    """One ``decompress_many`` call, stage by stage (named as in the benchmark's table)."""

    def __init__(self, b, blobs: list, bases: list, planes_only: bool, timer) -> None:
        self.b, self.blobs, self.bases, self.planes_only = b, blobs, bases, planes_only
        self.keep: list = []
        self.staging = Staging(b)
        self.mark = timer.mark if timer is not None else (lambda stage: None)

    def headers(self) -> None:
        """Every container header and nvCOMP payload table (blobs on the device: two
        small reads), checked; planes of CPU codecs (zstd) and layouts without a kernel
        decoded here on the host."""
        b, keep, bases = self.b, self.keep, self.bases
        host_mv: list = []
        dev: dict[int, tuple[int, int]] = {}
        for i, blob in enumerate(self.blobs):
            mod = type(blob).__module__
            if mod.startswith("cupy") or (mod.startswith("torch") and
                                          getattr(blob, "is_cuda", False)):
                r = resolve(b, [blob], self.staging, keep)[0]
                dev[i] = (r.ptr, r.nbytes)
                host_mv.append(None)
            else:
                host_mv.append(memoryview(blob).cast("B"))
        prefixes = dict(zip(dev, download_ranges(
            b, [(p, min(n, PREFIX)) for p, n in dev.values()], keep)))
        heads = [C.unpack(mv) if mv is not None else
                 C.unpack(prefixes[i], whole=False, total=dev[i][1])
                 for i, mv in enumerate(host_mv)]
        dts = [_check_head(i, h, bases[i] is not None or self.planes_only, self.planes_only)
               for i, h in enumerate(heads)]
        srcs: list[list[_Src]] = []
        for h in heads:
            pos, row = h.payload_offset, []
            for ph in h.planes:
                _known(ph.codec_id, ph.codec_major)
                row.append(_Src(ph.codec_id, ph.codec_major, pos, ph.enc_len))
                pos += ph.enc_len
            srcs.append(row)
        _read_tables(b, srcs, heads, host_mv, dev, keep)
        layouts = [h.layout for h in heads]
        for i, (h, dt) in enumerate(zip(heads, dts)):
            if K.variant(dt, h.layout) is None:       # no kernel for this layout: merge here
                mv = host_mv[i]
                if mv is None:
                    mv = memoryview(download_ranges(b, [(dev[i][0], dev[i][1])], keep)[0])
                planes = [P.decoder_for(s.cid, s.major).decode(mv[s.pos: s.pos + s.enc],
                                                               ph.raw_len)
                          for s, ph in zip(srcs[i], h.planes)]
                merged = _planes.merge(planes, dt, h.layout, h.raw_len)
                srcs[i] = [_Src(P.RAW, 1, 0, h.raw_len, host=bytes(merged))]
                layouts[i] = _planes.FLAT
        for i, (h, row) in enumerate(zip(heads, srcs)):
            for s, raw in zip(row, _planes.plane_sizes(dts[i], layouts[i], h.raw_len)):
                if s.host is not None:
                    continue
                if s.cid in CODEC_NAMES:
                    if s.cid == P.NVCOMP_ANS:
                        _codecs.check_ans_version(s.head.version, b.nvcomp_version)
                elif s.cid == P.RAW:
                    if s.enc != raw:
                        raise FormatError(f"raw plane holds {s.enc} bytes, header says {raw}")
                elif s.cid == P.CONST:
                    if s.enc != 1:
                        raise FormatError("constant plane payload must be one byte")
                else:
                    payload = (host_mv[i][s.pos: s.pos + s.enc] if host_mv[i] is not None
                               else download_ranges(b, [(dev[i][0] + s.pos, s.enc)], keep)[0])
                    s.host = P.decoder_for(s.cid, s.major).decode(payload, raw)
        self.host_mv, self.dev, self.heads, self.dts = host_mv, dev, heads, dts
        self.srcs, self.layouts = srcs, layouts
        self.mark("headers")

    def stage_in(self) -> None:
        """One staged upload: host blobs, host-decoded planes, host bases."""
        b, keep, staging, heads = self.b, self.keep, self.staging, self.heads
        blob_at = {i: staging.add(mv) for i, mv in enumerate(self.host_mv) if mv is not None}
        self.host_at = {(i, k): staging.add(memoryview(s.host))
                        for i, row in enumerate(self.srcs)
                        for k, s in enumerate(row) if s.host is not None}
        base_in = resolve(b, [x for x in self.bases if x is not None], staging, keep)
        staging.flush()
        keep.append(staging)
        base_in = iter(finish(b, base_in, staging, keep))
        self.base_ptr: list[int] = []
        for i, x in enumerate(self.bases):
            if x is None or self.planes_only:
                self.base_ptr.append(0)
                continue
            r = next(base_in)
            if r.nbytes != heads[i].raw_len:
                raise BaseMismatchError(
                    f"blob {i} was written against a base of {heads[i].raw_len} bytes; the "
                    f"base given has {r.nbytes}")
            self.base_ptr.append(r.ptr)
        self.blob_ptr = [self.dev[i][0] if i in self.dev else b.ptr(staging.dev) + blob_at[i]
                         for i in range(len(self.blobs))]
        self.mark("stage in")

    def restore(self) -> None:
        """Every plane into one scratch: raw copies, constant fills, nvCOMP batches."""
        b, keep, srcs, host_mv, blob_ptr = self.b, self.keep, self.srcs, self.host_mv, \
            self.blob_ptr
        self.jobs = jobs = [plan(dt, lay, h.raw_len)
                            for dt, lay, h in zip(self.dts, self.layouts, self.heads)]
        const_dev = [(i, k) for i, row in enumerate(srcs) for k, s in enumerate(row)
                     if s.host is None and s.cid == P.CONST and host_mv[i] is None
                     and jobs[i].planes[k].raw]
        const_val = dict(zip(const_dev, download_ranges(
            b, [(blob_ptr[i] + srcs[i][k].pos, 1) for i, k in const_dev], keep)))
        rows = []
        for i, (j, row) in enumerate(zip(jobs, srcs)):
            r = []
            for k, (p, s) in enumerate(zip(j.planes, row)):
                if p.raw == 0:
                    r.append(None)
                elif s.host is not None:
                    r.append(("copy", b.ptr(self.staging.dev) + self.host_at[(i, k)]))
                elif s.cid == P.RAW:
                    r.append(("copy", blob_ptr[i] + s.pos))
                elif s.cid == P.CONST:
                    r.append(("fill", host_mv[i][s.pos] if host_mv[i] is not None
                              else const_val[(i, k)][0]))
                else:
                    r.append(("coded", spec_for(s.cid, s.head), s.head.sizes,
                              blob_ptr[i] + s.pos + s.head.data_offset))
            rows.append(r)
        self.scratch = restore_planes(b, jobs, rows, keep, self.mark)
        self.mark("nvcomp")

    def merge(self) -> None:
        """Planes merged into the outputs, XOR-ing bases back in."""
        self.out_dev, self.out_off = merge_planes(self.b, self.jobs, self.scratch,
                                                  self.base_ptr, self.keep)
        op = self.b.ptr(self.out_dev)
        self.out_ptrs = [op + o for o in self.out_off]
        self.mark("merge")

    def verify(self, report: bool = False):
        """XXH3 of every output (and base) on the device, against its header."""
        got = _verify(self.b, self.heads, self.out_ptrs, self.base_ptr, self.keep, report)
        self.mark("checksum")
        return got

    def hand_out(self, out: str) -> list:
        """The outputs: device views, or one copy into pinned host memory."""
        b, heads, out_off = self.b, self.heads, self.out_off
        if out == "device":
            b.synchronize()
            return [b.view(self.out_dev, out_off[i], h.raw_len) for i, h in enumerate(heads)]
        tot = out_off[-1] + heads[-1].raw_len
        host = b.pinned(tot)
        b.download(self.out_dev, 0, host[:tot])
        b.synchronize()
        self.mark("copy out")
        views = [host[out_off[i]: out_off[i] + h.raw_len] for i, h in enumerate(heads)]
        if out == "host":
            return [memoryview(v) for v in views]
        return [v.tobytes() for v in views]


def spec_for(cid: int, head: _payload.PayloadHeader) -> CodecSpec:
    """The nvCOMP configuration that decodes a plane: what its payload header records,
    nothing else (the encoder's self-check decodes with it too)."""
    return CodecSpec(CODEC_NAMES[cid], head.option, head.chunk)


# --------------------------------------------------------------------------- device stages
# (the encoder's self-check runs the same two stages over the blobs it just wrote)

def restore_planes(b, jobs: list, rows: list, keep: list, mark=lambda stage: None):
    """Every plane of every job into one scratch buffer (offsets from ``place``).

    ``rows[i][k]`` says where plane k of job i comes from: ``("copy", ptr)`` (raw bytes
    on the device), ``("fill", byte)`` (a constant plane) or ``("coded", spec, sizes,
    ptr)`` (nvCOMP chunks of those compressed sizes, back to back from ``ptr``). Raw
    copies and fills are one launch each; coded chunks are gathered to aligned addresses
    and decoded in one nvCOMP batch per codec configuration.
    """
    total, _ = place(jobs)
    scratch = b.empty(total)
    sp = b.ptr(scratch)
    keep.append(scratch)
    copies, fills = Segments(), Segments()
    batches: dict[CodecSpec, dict] = {}
    for j, row in zip(jobs, rows):
        for p, src in zip(j.planes, row):
            if p.raw == 0:
                continue
            if src[0] == "copy":
                copies.add(src[1], sp + p.off, p.raw)
            elif src[0] == "fill":
                fills.add(sp + p.off, p.raw, int(src[1]))
            else:
                _, spec, sizes, ptr = src
                bt = batches.setdefault(spec, {"sizes": [], "planes": []})
                bt["sizes"].append(np.asarray(sizes, dtype=np.int64))
                bt["planes"].append((ptr, p.off, p.raw, len(sizes)))
    copies.launch(b, keep)
    fills.launch(b, keep, "fill_segments")
    mark("raw planes")
    for spec, bt in batches.items():            # every chunk of a codec, vectorized
        csize = np.concatenate(bt["sizes"])
        src0, off, raw, cnt = (np.asarray(x, dtype=np.int64) for x in zip(*bt["planes"]))
        idx = np.repeat(np.arange(len(cnt)), cnt)
        first = np.cumsum(cnt) - cnt
        within = np.arange(len(idx)) - first[idx]
        excl = np.cumsum(csize) - csize
        src = src0[idx] + excl - excl[first][idx]
        dst = off[idx] + within * spec.chunk
        rsize = np.minimum(spec.chunk, raw[idx] - within * spec.chunk)
        align = b.decompress_alignment(spec)
        padded = (csize + align - 1) // align * align
        coff = np.cumsum(padded) - padded
        cin = b.empty(int(padded.sum()))
        keep.append(cin)
        g = Segments()
        g.add(src, b.ptr(cin) + coff, csize)
        g.launch(b, keep)
        b.decode(spec, cin, coff.tolist(), csize.tolist(), scratch, dst.tolist(), rsize.tolist())
    if batches:
        # nvCOMP queues its work on our stream; waiting here also keeps its batch
        # descriptors (freed when the call's Python objects go) from outliving the kernels
        b.synchronize()
    return scratch


def merge_planes(b, jobs: list, scratch, base_ptr: list[int], keep: list):
    """Merge every job's planes into one output buffer, XOR-ing bases (non-zero
    pointers) back in; returns the buffer and each output's offset in it."""
    out_off, tot = [], 0
    for j in jobs:
        out_off.append(tot)
        tot = round_up(tot + j.raw_len, ALIGN)
    out_dev = b.empty(tot)
    op = b.ptr(out_dev)
    descs = descriptors(jobs, [op + o for o in out_off], base_ptr, b.ptr(scratch))
    launch_planes(b, "merge", jobs, descs, 0, keep)
    return out_dev, out_off


def _verify(b, heads, out_ptrs, base_ptr, keep, report: bool = False):
    """Check every output (and base) against its header; raise on the first mismatch,
    or with ``report`` return one bool per blob (True: restored exactly)."""
    with_base = [i for i, p in enumerate(base_ptr) if p]
    ptrs = list(out_ptrs) + [base_ptr[i] for i in with_base]
    lens = [h.raw_len for h in heads] + [heads[i].raw_len for i in with_base]
    d_hash = hash_buffers(b, ptrs, lens, keep)
    got = np.empty(len(ptrs), dtype=np.uint64)
    b.download(d_hash, 0, got.view(np.uint8))
    b.synchronize()
    if report:
        ok = [int(got[i]) == h.checksum for i, h in enumerate(heads)]
        for k, i in enumerate(with_base):
            ok[i] = ok[i] and int(got[len(heads) + k]) == heads[i].base_checksum
        return ok
    for k, i in enumerate(with_base):
        if int(got[len(heads) + k]) != heads[i].base_checksum:
            raise BaseMismatchError(
                f"blob {i} was written against a different base (its checksum does not "
                f"match); pass the exact base bytes it was coded with")
    for i, h in enumerate(heads):
        if int(got[i]) != h.checksum:
            raise ChecksumError(
                f"chunk checksum mismatch in blob {i}: the stored bytes are corrupt; restore "
                f"this file from another copy (s4fs never returns bytes it cannot verify)")


def _read_tables(b, srcs, heads, host_mv, dev, keep) -> None:
    """Payload headers of every nvCOMP plane (two small reads for blobs on the device)."""
    want = []
    for i, (h, row) in enumerate(zip(heads, srcs)):
        for s, ph in zip(row, h.planes):
            if s.cid not in CODEC_NAMES:
                continue
            name = P.codec_name(s.cid)
            if host_mv[i] is not None:
                s.head = _payload.parse(host_mv[i][s.pos: s.pos + s.enc], ph.raw_len, name)
            else:
                want.append((i, s, ph.raw_len))
    if not want:
        return
    fixed = download_ranges(b, [(dev[i][0] + s.pos, min(s.enc, _payload.FIXED_SIZE))
                                for i, s, _ in want], keep)
    ranges = []
    for (i, s, raw), f in zip(want, fixed):
        chunk = _payload.FIXED.unpack_from(f)[4] if len(f) == _payload.FIXED_SIZE else 0
        n = _payload.header_size(raw, chunk) if chunk else len(f)
        ranges.append((dev[i][0] + s.pos, min(s.enc, n)))
    tables = download_ranges(b, ranges, keep)
    for (i, s, raw), t in zip(want, tables):
        s.head = _payload.parse_table(t, s.enc, raw, P.codec_name(s.cid))


def _check_head(i: int, head: C.Header, has_base: bool, planes_only: bool) -> DType:
    if not planes_only:
        if head.delta and not has_base:
            raise BaseMismatchError(
                f"blob {i} is a delta: pass the base it was written against (bases=...)")
        if not head.delta and has_base:
            raise BaseMismatchError(f"blob {i} is not a delta, but a base was given")
    dt = from_code(head.dtype_code)
    if head.layout not in getattr(_planes, "LAYOUTS", (_planes.FLAT, _planes.FLOAT, _planes.BYTES)):
        raise UnsupportedVersionError(
            f"blob uses plane layout {head.layout}, unknown to this s4fs; upgrade s4fs")
    expected = _planes.plane_sizes(dt, head.layout, head.raw_len)
    if [p.raw_len for p in head.planes] != expected:
        raise FormatError(
            f"blob plane sizes {[p.raw_len for p in head.planes]} do not fit a "
            f"{dt.name} layout-{head.layout} chunk of {head.raw_len} bytes")
    return dt


def _known(cid: int, major: int) -> None:
    if cid in CODEC_NAMES:
        if major > 1:
            raise UnsupportedVersionError(
                f"plane codec {P.codec_name(cid)} v{major} is newer than this s4fs supports "
                f"(v1); upgrade s4fs to read this blob")
        return
    P.decoder_for(cid, major)           # raises for unknown ids and majors

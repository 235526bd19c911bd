"""GPU decoder: many blobs decoded with a few launches, the encoder's steps backwards.

The stages of one ``decompress_many`` call (methods of ``_Decode``, named as in the
benchmark's stage table):

* headers — every container header (``codec._container.unpack_many`` parses the whole
  batch) and nvCOMP payload table, checked (blobs on the device: two small reads); a
  batch with planes of CPU codecs (zstd), layouts without a kernel, or a header the batch
  reader refuses goes blob by blob (``unpack``), those planes decoded on the host;
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
from .. import _nvcomp_payload as _payload
from .. import _plane_codecs as P
from .. import _planes
from .._dtypes import DType, from_code
from .._nvcomp_twins import check_ans_version
from . import _kernels as K
from ._backend import CodecSpec, settle
from ._common import (
    ALIGN,
    CODEC_NAMES,
    Plan,
    Segments,
    Staging,
    device_indices,
    download_gather,
    download_ranges,
    finish,
    hash_buffers,
    launch_planes,
    resolve,
)

PREFIX = 512            # bytes read back to parse the header of a blob on the device
TABLE_GUESS = 1 << 16   # nvCOMP chunk size the first read of payload tables assumes


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


BLOB, FILL, CODED, HOST = 0, 1, 2, 3     # where a plane comes from (``_Decode.pkind``)
_NVCOMP = np.array(sorted(CODEC_NAMES), dtype=np.int64)


class _Decode:
    """One ``decompress_many`` call, stage by stage (named as in the benchmark's table).

    After ``headers`` the call is held in columns: per blob ``checksum``,
    ``base_checksum``, ``raw_len``; the plane plan ``pl``; per plane ``pkind`` (raw bytes
    in the blob, a constant to fill, nvCOMP chunks, or bytes decoded on the host),
    ``ppos`` (offset in its blob: of the raw bytes, the constant, or the first chunk),
    ``pspec`` / ``pcount`` and ``psizes`` (nvCOMP configuration and chunk sizes).
    """

    def __init__(self, b, blobs: list, bases: list, planes_only: bool, timer) -> None:
        self.b, self.blobs, self.bases, self.planes_only = b, blobs, bases, planes_only
        self.keep: list = []
        self.staging = Staging(b)
        self.mark = timer.mark if timer is not None else (lambda stage: None)
        self.host_planes: dict[int, bytes] = {}
        self.fill_val = None        # constant planes' bytes, when the headers read them
        self.later: list = []       # nvCOMP verdicts, read after the next wait

    def headers(self) -> None:
        """Every container header and nvCOMP payload table, checked: read for all blobs
        at once (blobs on the device: a few small reads); a batch with anything else —
        planes of CPU codecs (zstd), layouts without a kernel, or a header the batch
        reader refuses — goes blob by blob, which decodes those planes here on the host
        and says what is wrong with a bad blob."""
        b, keep, blobs = self.b, self.keep, self.blobs
        on_dev = device_indices(blobs)
        host_mv: list = [None] * len(blobs)
        if len(on_dev) < len(blobs):
            for i in sorted(set(range(len(blobs))) - set(on_dev)):
                host_mv[i] = memoryview(blobs[i]).cast("B")
        got = resolve(b, [blobs[i] for i in on_dev], self.staging, keep)
        self.host_mv = host_mv
        self.dev = {i: (r.ptr, r.nbytes) for i, r in zip(on_dev, got)}
        self.dev_ptr = np.zeros(len(blobs), dtype=np.int64)
        self.dev_ptr[on_dev] = [r.ptr for r in got]
        self.dev_len = np.zeros(len(blobs), dtype=np.int64)
        self.dev_len[on_dev] = [r.nbytes for r in got]
        if not self._headers_batch():
            self._headers_each()
        self.mark("headers")

    def _read(self, planes_blob, pos, lens) -> tuple[bytes, np.ndarray]:
        """Bytes at ``pos`` (``lens`` each, fewer where a blob ends) of the given blobs: one
        buffer and the start of each piece (device blobs: one gather and one copy back)."""
        host_mv, dev = self.host_mv, self.dev
        if len(dev) == len(host_mv):            # every blob on the device: no loop
            return download_gather(self.b, self.dev_ptr[planes_blob] + pos, lens, self.keep)
        pieces: list = [None] * len(pos)
        want = []
        for q, (i, p, n) in enumerate(zip(planes_blob.tolist(), pos.tolist(), lens.tolist())):
            mv = host_mv[i]
            if mv is not None:
                pieces[q] = bytes(mv[p: p + n])
            else:
                want.append((q, dev[i][0] + p, n))
        if want:
            for (q, _, _), got in zip(want, download_ranges(
                    self.b, [(ptr, n) for _, ptr, n in want], self.keep)):
                pieces[q] = got
        ln = np.fromiter((len(x) for x in pieces), np.int64, len(pieces))
        return b"".join(pieces), np.cumsum(ln) - ln

    # long on purpose: the steps of unpack_many on device prefixes, then the payload
    # tables, in one pass over columns; each step narrows the blobs the next reads
    def _headers_batch(self) -> bool:
        """The headers of all blobs with array operations; False: go blob by blob."""
        n = len(self.blobs)
        totals = self.dev_len.copy()
        if len(self.dev) < n:
            for i, mv in enumerate(self.host_mv):
                if mv is not None:
                    totals[i] = len(mv)
        buf, starts = self._read(np.arange(n), np.zeros(n, dtype=np.int64),
                                 np.minimum(totals, PREFIX))
        avail = np.diff(np.append(starts, len(buf)))
        heads, bad = C.unpack_many(buf, starts, totals, avail)
        if len(bad):
            return False
        has_base = np.array([x is not None for x in self.bases], dtype=bool)
        if not self.planes_only and np.any(heads.delta != has_base):
            return False
        known = getattr(_planes, "LAYOUTS", (_planes.FLAT, _planes.FLOAT, _planes.BYTES))
        # the dtype of every blob, decided once per (dtype code, layout) pair present
        pairs, which = np.unique(heads.dtype_code.astype(np.int64) * 256 + heads.layout,
                                 return_inverse=True)
        kinds = []
        for key in pairs.tolist():
            code, lay = divmod(key, 256)
            try:
                dt = from_code(code)
            except CodecError:
                return False
            if lay not in known or not K.variant(dt, lay):
                return False
            kinds.append(dt)
        dts = [kinds[k] for k in which.reshape(-1).tolist()]
        pl = Plan(dts, heads.layout, heads.coded_len)
        if not (np.array_equal(pl.np, heads.nplanes) and
                np.array_equal(pl.raw, heads.plane_raw)):
            return False
        cid, major, enc = heads.codec_id, heads.codec_major, heads.enc_len
        coded = np.isin(cid, _NVCOMP)
        raw, const = cid == P.RAW, cid == P.CONST
        if not (np.all(coded | raw | const) and np.all(major[coded] == 1) and
                np.all(major[raw] == P.Raw.major) and np.all(major[const] == P.Const.major) and
                np.all(enc[raw] == pl.raw[raw]) and np.all(enc[const] == 1)):
            return False
        cq = np.flatnonzero(coded)
        cb, cpos = heads.blob[cq], heads.pos[cq]
        # payload tables, read as long as a chunk of TABLE_GUESS bytes makes them; once more
        # at their exact length when a table lists more chunks than that
        tlen = _payload.FIXED_SIZE + 4 * (-(-pl.raw[cq] // TABLE_GUESS))
        # the bytes of constant planes come in the same read
        fq = np.flatnonzero(const & (pl.raw > 0))
        tables, tstart = self._read(np.concatenate([cb, heads.blob[fq]]),
                                    np.concatenate([cpos, heads.pos[fq]]),
                                    np.concatenate([np.minimum(enc[cq], tlen),
                                                    np.ones(len(fq), dtype=np.int64)]))
        fill_val = np.zeros(pl.nplanes, dtype=np.int64)
        fill_val[fq] = np.frombuffer(tables, dtype=np.uint8)[tstart[len(cq):]]
        tstart = tstart[: len(cq)]
        option, chunk, version, counts, sizes, tbad = _payload.parse_many(
            tables, tstart, enc[cq], pl.raw[cq], np.diff(np.append(tstart, len(tables))))
        if len(tbad):
            a = np.concatenate([np.frombuffer(tables, dtype=np.uint8), np.zeros(8, np.uint8)])
            chunk = sum(a[tstart + 4 + k].astype(np.int64) << (8 * k) for k in range(4))
            tlen = _payload.FIXED_SIZE + 4 * (-(-pl.raw[cq] // np.maximum(chunk, 1)))
            tables, tstart = self._read(cb, cpos, np.minimum(enc[cq], tlen))
            option, chunk, version, counts, sizes, tbad = _payload.parse_many(
                tables, tstart, enc[cq], pl.raw[cq], np.diff(np.append(tstart, len(tables))))
            if len(tbad):
                return False
        ans = cid[cq] == P.NVCOMP_ANS
        if ans.any():
            for v in map(tuple, np.unique(np.asarray(version)[ans], axis=0).tolist()):
                try:
                    check_ans_version(v, self.b.nvcomp_version)
                except CodecError:
                    return False
        pkind = np.where(coded, CODED, np.where(const, FILL, BLOB))
        ppos = heads.pos.copy()
        ppos[cq] += _payload.FIXED_SIZE + 4 * counts
        spec_of, self.specs, pcount = _plane_specs(pl.nplanes, cq, cid, option, chunk, counts)
        self.checksum, self.base_checksum = heads.checksum, heads.base_checksum
        self.raw_len, self.pl = heads.raw_len, pl
        self.diffs = [(i, dts[i].itemsize) for i in np.flatnonzero(heads.diff).tolist()]
        self.pkind, self.ppos, self.pspec, self.pcount, self.psizes = \
            pkind, ppos, spec_of, pcount, sizes
        self.fill_val = fill_val
        zq = np.flatnonzero(heads.block_log2)
        zlog = heads.block_log2[zq]
        maps, _ = C.masked_maps(np.frombuffer(buf, dtype=np.uint8), heads.map_at[zq],
                                C.block_counts(heads.raw_len[zq], zlog))
        self.zero = (zq, zlog, maps)
        return True

    # long on purpose: the blob-by-blob twin of _headers_batch (the fallback), kept
    # step for step beside it so the two read the same fields in the same order
    def _headers_each(self) -> None:
        """Blob by blob: every header (``codec._container`` parses it) and payload table,
        checked; planes of CPU codecs and layouts without a kernel decoded on the host."""
        b, keep, bases, host_mv, dev = self.b, self.keep, self.bases, self.host_mv, self.dev
        prefixes = dict(zip(dev, download_ranges(
            b, [(p, min(n, PREFIX)) for p, n in dev.values()], keep)))
        heads = [C.unpack(mv) if mv is not None else
                 C.unpack(prefixes[i], whole=False, total=dev[i][1])
                 for i, mv in enumerate(host_mv)]
        dts = [_check_head(i, h, bases[i] is not None or self.planes_only, self.planes_only)
               for i, h in enumerate(heads)]
        if not self.planes_only and any(h.pair for h in heads):
            # a residual on a low-precision copy: s4fs.codec.decompress restores it
            raise CodecError("a batch holds a blob coded on a low-precision copy (a pair); "
                             "decode it with s4fs.codec.decompress, which restores pairs")
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
                merged = _planes.merge(planes, dt, h.layout, h.coded_len)
                srcs[i] = [_Src(P.RAW, 1, 0, h.coded_len, host=bytes(merged))]
                layouts[i] = _planes.FLAT
        for i, (h, row) in enumerate(zip(heads, srcs)):
            for s, raw in zip(row, _planes.plane_sizes(dts[i], layouts[i], h.coded_len)):
                if s.host is not None:
                    continue
                if s.cid in CODEC_NAMES:
                    if s.cid == P.NVCOMP_ANS:
                        check_ans_version(s.head.version, b.nvcomp_version)
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
        # the same columns as the batch reader's
        self.checksum = np.array([h.checksum for h in heads], dtype=np.uint64)
        self.base_checksum = np.array([h.base_checksum or 0 for h in heads], dtype=np.uint64)
        self.raw_len = np.array([h.raw_len for h in heads], dtype=np.int64)
        self.diffs = [(i, dts[i].itemsize) for i, h in enumerate(heads) if h.diff]
        self.pl = pl = Plan(dts, layouts, [h.coded_len for h in heads])
        zq = [i for i, h in enumerate(heads) if h.block]
        maps = np.frombuffer(b"".join(heads[i].keep_map for i in zq), dtype=np.uint8)
        mlen = np.array([len(heads[i].keep_map) for i in zq], dtype=np.int64)
        zlog = np.array([heads[i].block.bit_length() - 1 for i in zq], dtype=np.int64)
        maps, _ = C.masked_maps(maps, np.cumsum(mlen) - mlen,
                                C.block_counts(self.raw_len[zq], zlog))
        self.zero = (np.array(zq, dtype=np.int64), zlog, maps)
        self.pkind = np.zeros(pl.nplanes, dtype=np.int64)
        self.ppos = np.zeros(pl.nplanes, dtype=np.int64)
        self.pspec = np.full(pl.nplanes, -1, dtype=np.int64)
        self.pcount = np.zeros(pl.nplanes, dtype=np.int64)
        sizes, combos = [], {}
        for i, row in enumerate(srcs):
            for k, s in enumerate(row):
                q = int(pl.p0[i]) + k
                self.ppos[q] = s.pos
                if s.host is not None:
                    self.pkind[q] = HOST
                    self.host_planes[q] = s.host
                elif s.cid == P.RAW:
                    self.pkind[q] = BLOB
                elif s.cid == P.CONST:
                    self.pkind[q] = FILL
                else:
                    self.pkind[q] = CODED
                    self.ppos[q] += s.head.data_offset
                    self.pspec[q] = combos.setdefault(spec_for(s.cid, s.head), len(combos))
                    self.pcount[q] = s.head.nchunks
                    sizes.append(np.asarray(s.head.sizes, dtype=np.int64))
        self.specs = list(combos)
        self.psizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)

    def stage_in(self) -> None:
        """One staged upload: host blobs, host-decoded planes, host bases."""
        b, keep, staging = self.b, self.keep, self.staging
        blob_at = {i: staging.add(mv) for i, mv in enumerate(self.host_mv) if mv is not None}
        self.host_at = {q: staging.add(memoryview(x)) for q, x in self.host_planes.items()}
        base_in = resolve(b, [x for x in self.bases if x is not None], staging, keep)
        staging.flush()
        keep.append(staging)
        base_in = iter(finish(b, base_in, staging, keep))
        self.base_ptr = np.zeros(len(self.blobs), dtype=np.uint64)
        for i, x in enumerate(self.bases):
            if x is None:
                continue
            r = next(base_in)
            if self.planes_only:
                continue
            if r.nbytes != int(self.raw_len[i]):
                raise BaseMismatchError(
                    f"blob {i} was written against a base of {int(self.raw_len[i])} bytes; "
                    f"the base given has {r.nbytes}")
            self.base_ptr[i] = r.ptr
        sdev = b.ptr(staging.dev) if staging.dev is not None else 0
        self.blob_ptr = np.array([self.dev[i][0] if i in self.dev else sdev + blob_at[i]
                                  for i in range(len(self.blobs))], dtype=np.int64)
        self.sdev = sdev
        self.mark("stage in")

    def restore(self) -> None:
        """Every plane into one scratch: raw copies, constant fills, nvCOMP batches."""
        pl, pkind = self.pl, self.pkind
        ptr = self.blob_ptr[pl.job] + self.ppos
        for q, at in self.host_at.items():
            ptr[q] = self.sdev + at
        val = self.fill_val                     # read with the headers (the batch path)
        if val is None:
            val = np.zeros(pl.nplanes, dtype=np.int64)
            fq = np.flatnonzero((pkind == FILL) & (pl.raw > 0))
            if len(fq):
                got, at = self._read(pl.job[fq], self.ppos[fq],
                                     np.ones(len(fq), dtype=np.int64))
                val[fq] = np.frombuffer(got, dtype=np.uint8)[at]
        kind = np.where((pkind == BLOB) | (pkind == HOST), COPY, pkind)
        src = Sources(kind=kind, ptr=ptr, val=val, spec=self.pspec, specs=self.specs,
                      counts=self.pcount, sizes=self.psizes)
        self.scratch = restore_planes(self.b, pl, src, self.keep, self.mark, self.later)
        self.mark("nvcomp")

    def merge(self) -> None:
        """Planes merged into the outputs, XOR-ing bases back in; difference deltas
        (``FLAG_DIFF``) merge without their base, then add it to their words."""
        xor_base = self.base_ptr
        if self.diffs and not self.planes_only:
            xor_base = self.base_ptr.copy()
            xor_base[[i for i, _ in self.diffs]] = 0
        if len(self.zero[0]):
            self.out_dev, self.out_off = merge_expanding(self.b, self.pl, self.scratch,
                                                         xor_base, self.raw_len,
                                                         self.zero, self.keep)
        else:
            self.out_dev, self.out_off = merge_planes(self.b, self.pl, self.scratch,
                                                      xor_base, self.keep)
        self.out_ptrs = self.b.ptr(self.out_dev) + self.out_off
        if not self.planes_only:
            for i, itemsize in self.diffs:
                self.b.undiff_into(int(self.out_ptrs[i]), int(self.base_ptr[i]),
                                   int(self.raw_len[i]), itemsize)
        self.mark("merge")

    def verify(self, report: bool = False):
        """XXH3 of every output (and base) on the device, against its header."""
        got = _verify(self.b, self.checksum, self.base_checksum, self.raw_len, self.out_ptrs,
                      self.base_ptr, self.keep, report, self.later)
        self.mark("checksum")
        return got

    def hand_out(self, out: str) -> list:
        """The outputs: device views, or one copy into pinned host memory."""
        b, out_off, raw = self.b, self.out_off.tolist(), self.raw_len.tolist()
        if out == "device":
            b.synchronize()
            settle(self.later)
            return b.views(self.out_dev, out_off, raw)
        tot = out_off[-1] + raw[-1]
        host = b.pinned(tot)
        b.download(self.out_dev, 0, host[:tot])
        b.synchronize()
        settle(self.later)
        self.mark("copy out")
        views = [host[o: o + n] for o, n in zip(out_off, raw)]
        if out == "host":
            return [memoryview(v) for v in views]
        return [v.tobytes() for v in views]


def spec_for(cid: int, head: _payload.PayloadHeader) -> CodecSpec:
    """The nvCOMP configuration that decodes a plane: what its payload header records,
    nothing else (the encoder's self-check decodes with it too)."""
    return CodecSpec(CODEC_NAMES[cid], head.option, head.chunk)


# --------------------------------------------------------------------------- device stages
# (the encoder's self-check runs the same two stages over the blobs it just wrote)

COPY = BLOB


@dataclass
class Sources:
    """Where every plane of a plan comes from, as columns: ``kind`` (``COPY``: raw bytes
    on the device at ``ptr``; ``FILL``: the byte ``val``; ``CODED``: nvCOMP chunks back
    to back from ``ptr``, ``counts`` of them with configuration ``specs[spec]``) and the
    compressed ``sizes`` of every chunk, planes in order."""

    kind: np.ndarray
    ptr: np.ndarray
    val: np.ndarray
    spec: np.ndarray
    specs: list
    counts: np.ndarray
    sizes: np.ndarray


def plane_sources(heads: C.Headers, pl: Plan, blob_ptr, const_val, tables) -> Sources:
    """The sources of blobs read from their headers (``codec._container.unpack_many``):
    raw planes at their offset in each blob, constants (``const_val(planes)`` gives their
    bytes), nvCOMP planes as their payload tables record them (``tables(planes)`` gives a
    buffer and where each table starts in it); raises FormatError for a table the
    payload reader refuses."""
    cid = heads.codec_id
    cq = np.flatnonzero(np.isin(cid, _NVCOMP))
    fq = np.flatnonzero(cid == P.CONST)
    kind = np.where(cid == P.CONST, FILL, COPY)
    kind[cq] = CODED
    val = np.zeros(pl.nplanes, dtype=np.int64)
    val[fq] = const_val(fq)
    ptr = np.asarray(blob_ptr, dtype=np.int64)[heads.blob] + heads.pos
    buf, starts = tables(cq)
    option, chunk, _, counts, sizes, bad = _payload.parse_many(
        buf, starts, heads.enc_len[cq], heads.plane_raw[cq])
    if len(bad):
        q = int(cq[bad[0]])
        _payload.parse_table(memoryview(buf)[int(starts[bad[0]]):], int(heads.enc_len[q]),
                             int(heads.plane_raw[q]), P.codec_name(int(cid[q])))
        raise FormatError("a payload table is malformed")
    ptr[cq] += _payload.FIXED_SIZE + 4 * counts
    spec, specs, pcount = _plane_specs(pl.nplanes, cq, cid, option, chunk, counts)
    return Sources(kind, ptr, val, spec, specs, pcount, sizes)


def _plane_specs(nplanes: int, cq, cid, option, chunk, counts):
    """Per plane the index of its nvCOMP configuration (what its payload table records:
    codec, option, chunk size; -1 for planes ``cq`` does not list), the configurations,
    and per plane its chunk count."""
    pcount = np.zeros(nplanes, dtype=np.int64)
    pcount[cq] = counts
    spec = np.full(nplanes, -1, dtype=np.int64)
    if not len(cq):
        return spec, [], pcount
    c, o, ch = (np.asarray(x, dtype=np.int64).reshape(-1) for x in
                (np.asarray(cid)[cq], option, chunk))
    if c.min() >= 0 and c.max() < 1 << 15 and o.min() >= 0 and o.max() < 1 << 16 and \
            ch.min() >= 0 and ch.max() < 1 << 32:           # one int64 key per plane
        keys, which = np.unique((c << 48) | (o << 32) | ch, return_inverse=True)
        combos = [(k >> 48, (k >> 32) & 0xFFFF, k & 0xFFFFFFFF) for k in keys.tolist()]
    else:
        rows, which = np.unique(np.stack([c, o, ch], axis=1), axis=0, return_inverse=True)
        combos = rows.tolist()
    spec[cq] = which.reshape(-1)
    return spec, [CodecSpec(CODEC_NAMES[a], b, d) for a, b, d in combos], pcount


def restore_planes(b, pl: Plan, src: Sources, keep: list, mark=lambda stage: None,
                   later: list | None = None):
    """Every plane of a plan into one scratch buffer (offsets from ``Plan.place``): raw
    copies and fills are one launch each; coded chunks are gathered to aligned
    addresses and decoded in one nvCOMP batch per codec configuration. With a ``later``
    list, nvCOMP's verdicts are left there for ``settle`` after the caller's next wait
    (no wait here)."""
    total = pl.place()
    scratch = b.empty(total)
    sp = b.ptr(scratch)
    keep.append(scratch)
    live = pl.raw > 0
    copies, fills = Segments(), Segments()
    m = live & (src.kind == COPY)
    copies.add(src.ptr[m], sp + pl.off[m], pl.raw[m])
    m = live & (src.kind == FILL)
    fills.add(sp + pl.off[m], pl.raw[m], src.val[m])
    copies.launch(b, keep)
    fills.launch(b, keep, "fill_segments")
    mark("raw planes")
    coded = live & (src.kind == CODED)
    cfirst = np.cumsum(src.counts) - src.counts
    for s in np.unique(src.spec[coded]).tolist():    # every chunk of a codec, vectorized
        spec = src.specs[s]
        g = np.flatnonzero(coded & (src.spec == s))
        cnt = src.counts[g]
        idx = np.repeat(np.arange(len(g)), cnt)
        first = np.cumsum(cnt) - cnt
        within = np.arange(len(idx)) - first[idx]
        csize = src.sizes[cfirst[g][idx] + within]
        excl = np.cumsum(csize) - csize
        srcp = src.ptr[g][idx] + excl - excl[first][idx]
        dst = pl.off[g][idx] + within * spec.chunk
        rsize = np.minimum(spec.chunk, pl.raw[g][idx] - within * spec.chunk)
        align = b.decompress_alignment(spec)
        padded = (csize + align - 1) // align * align
        coff = np.cumsum(padded) - padded
        cin = b.empty(int(padded.sum()))
        keep.append(cin)
        gs = Segments()
        gs.add(srcp, b.ptr(cin) + coff, csize)
        gs.launch(b, keep)
        b.decode(spec, cin, coff, csize, scratch, dst, rsize, later)
    if coded.any() and later is None:
        # nvCOMP queues its work on our stream; waiting here also keeps its batch
        # descriptors (freed when the call's Python objects go) from outliving the kernels
        b.synchronize()
    return scratch


def merge_planes(b, pl: Plan, scratch, base_ptr, keep: list, out_ptrs=None):
    """Merge every chunk's planes into one output buffer, XOR-ing bases (non-zero
    pointers) back in; returns the buffer and each output's offset in it. With
    ``out_ptrs``: into those addresses instead (returns None, None)."""
    out_dev = out_off = None
    if out_ptrs is None:
        size = (pl.raw_len + ALIGN - 1) // ALIGN * ALIGN
        out_off = np.cumsum(size) - size
        out_dev = b.empty(int(size.sum()))
        out_ptrs = b.ptr(out_dev) + out_off
    descs = pl.descriptors(out_ptrs, base_ptr, b.ptr(scratch))
    launch_planes(b, "merge", pl, descs, 0, keep)
    return out_dev, out_off


def merge_expanding(b, pl: Plan, scratch, base_ptr, raw_len, zero, keep: list):
    """``merge_planes`` for a batch with zero-block blobs (``zero``: their indices, block
    size log2 and keep maps back to back): one buffer of every blob at its full length;
    the other blobs merge straight into it, zero-block blobs into room past it, from where
    their stored runs are copied to their places between zero fills. Returns the buffer
    and each output's offset."""
    zq, zlog, maps = zero
    size = (raw_len + ALIGN - 1) // ALIGN * ALIGN
    off = np.cumsum(size) - size
    total = int(size.sum())
    kept = (pl.raw_len[zq] + ALIGN - 1) // ALIGN * ALIGN
    koff = total + np.cumsum(kept) - kept
    out = b.empty(total + int(kept.sum()))
    keep.append(out)
    op = b.ptr(out)
    at = op + off
    at[zq] = op + koff
    merge_planes(b, pl, scratch, base_ptr, keep, out_ptrs=at)
    rl = raw_len[zq]
    nblocks = C.block_counts(rl, zlog)
    # every map is whole bytes, its bits past the last block clear: runs end before them
    (own, dst, src, ln), _ = C.kept_runs_many(np.unpackbits(maps, bitorder="little"),
                                              8 * ((nblocks + 7) // 8), zlog, rl)
    fills, copies = Segments(), Segments()
    fills.add(op + off[zq], rl, np.zeros(len(zq), dtype=np.int64))
    copies.add(op + koff[own] + src, op + off[zq][own] + dst, ln)
    fills.launch(b, keep, "fill_segments")
    copies.launch(b, keep)
    return out, off


def _verify(b, checksum, base_checksum, raw_len, out_ptrs, base_ptr, keep, report=False,
            later=None):
    """Check every output (and base) against its header; raise on the first mismatch,
    or with ``report`` return one bool per blob (True: restored exactly). ``later``:
    nvCOMP verdicts ``restore_planes`` left (a chunk nvCOMP refused raises FormatError
    before any checksum is compared)."""
    with_base = np.flatnonzero(base_ptr)
    ptrs = np.concatenate([np.asarray(out_ptrs, dtype=np.uint64), base_ptr[with_base]])
    lens = np.concatenate([raw_len, raw_len[with_base]])
    d_hash = hash_buffers(b, ptrs, lens, keep)
    got = np.empty(len(ptrs), dtype=np.uint64)
    b.download(d_hash, 0, got.view(np.uint8))
    b.synchronize()
    settle(later)
    n = len(raw_len)
    ok = got[:n] == checksum
    base_ok = np.ones(n, dtype=bool)
    base_ok[with_base] = got[n:] == base_checksum[with_base]
    if report:
        return (ok & base_ok).tolist()
    for i in np.flatnonzero(~base_ok).tolist():
        raise BaseMismatchError(
            f"blob {i} was written against a different base (its checksum does not "
            f"match); pass the exact base bytes it was coded with")
    for i in np.flatnonzero(~ok).tolist():
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
    expected = _planes.plane_sizes(dt, head.layout, head.coded_len)
    if [p.raw_len for p in head.planes] != expected:
        raise FormatError(
            f"blob plane sizes {[p.raw_len for p in head.planes]} do not fit a "
            f"{dt.name} layout-{head.layout} chunk of {head.coded_len} bytes")
    return dt


def _known(cid: int, major: int) -> None:
    if cid in CODEC_NAMES:
        if major > 1:
            raise UnsupportedVersionError(
                f"plane codec {P.codec_name(cid)} v{major} is newer than this s4fs supports "
                f"(v1); upgrade s4fs to read this blob")
        return
    P.decoder_for(cid, major)           # raises for unknown ids and majors

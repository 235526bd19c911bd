"""GPU encoder: a whole batch of chunks hashed, split, coded and packed in a few launches.

The stages of one ``compress_many`` call (methods of ``_Encode``, named as in the
benchmark's stage table):

* stage in — inputs on the device (host inputs staged through pinned memory);
* zero blocks — which blocks of every full chunk are all zero (one launch, one small
  readback); chunks with enough of them are coded from their other blocks, gathered in
  one launch, and hashed again (the self-check restores those bytes);
* checksum — XXH3-64 of every input and base (3 launches; after the zero blocks' wait,
  so the device hashes while the host plans the split);
* split — planes into one scratch, XOR-ing delta bases on the fly, constant flags, first
  bytes, byte histograms and entropy estimates (one launch per plane layout, three small
  ones);
* readback — one small read of checksums, flags, first bytes and entropy estimates;
* choose codecs — constant and incompressible planes skip nvCOMP (host, no launch);
* nvcomp — one nvCOMP batch per codec configuration over every chunk of every plane;
* headers — every container header and payload table (``codec._container`` writes them);
* assemble — one gather launch packs every blob back to back;
* self-check — every blob decoded again from its header, on the device, with the
  decoder's own stages, and hashed; one readback (blobs that fail are coded on the CPU);
* copy out — blobs stay on the device, or come back in one copy to pinned host memory.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

from s4fs.errors import CodecError

from .. import _container as C
from .. import _nvcomp_payload as _payload
from .. import _plane_codecs as P
from .. import _planes
from .._dtypes import DType, from_code, lookup
from ._backend import CodecSpec, round_up, settle
from ._common import (
    ALIGN,
    CODEC_IDS,
    TAIL,
    Buffer,
    Plan,
    Segments,
    Staging,
    block_flags,
    finish,
    gpu_layout,
    hash_buffers,
    launch_planes,
    resolve,
    sample_entropy,
)
from ._profiles import DEFAULT, GpuProfile

log = logging.getLogger("s4fs.codec.gpu")

ZERO_RUN_ALGORITHM = 1      # nvCOMP GDeflate with LZ matches, for planes with zero runs


def compress_many(items, *, profile: GpuProfile | None = None, out: str = "bytes",
                  backend=None, timer=None) -> list:
    """Compress many chunks in one pass; see ``s4fs.codec.gpu.compress_many``.

    ``timer`` (benchmarks): an object whose ``mark(stage)`` is called after each stage.
    """
    from ._backend import cuda_backend
    profile = profile if isinstance(profile, GpuProfile) else DEFAULT
    if out not in ("bytes", "host", "device"):
        raise CodecError(f"out must be 'bytes', 'host' or 'device', not {out!r}")
    items = [tuple(it) + (None,) * (3 - len(it)) for it in items]
    if not items:
        return []
    run = _Encode(backend or cuda_backend(), profile, items, timer)
    run.stage_in()
    run.zero_blocks()
    run.checksum()
    run.split()
    run.readback()
    run.choose_codecs()
    run.code()
    run.headers()
    run.assemble()
    run.self_check()
    return run.hand_out(out)


class _Encode:
    """One ``compress_many`` call, stage by stage (each method is one stage; the
    benchmark's stage table names them)."""

    def __init__(self, b, profile: GpuProfile, items: list, timer) -> None:
        self.b, self.profile, self.items = b, profile, items
        self.dts = [d if isinstance(d, DType) else lookup(d) for _, d, _ in items]
        self.keep: list = []
        self.mark = timer.mark if timer is not None else (lambda stage: None)

    def stage_in(self) -> None:
        """Inputs and bases as device buffers (host ones staged through pinned memory)."""
        b, keep, items = self.b, self.keep, self.items
        staging = Staging(b)
        datas = resolve(b, [it[0] for it in items], staging, keep)
        bases_in = resolve(b, [it[2] for it in items if it[2] is not None], staging, keep)
        staging.flush()
        keep.append(staging)
        self.datas = finish(b, datas, staging, keep)
        self.inputs = list(self.datas)      # zero blocks replace some datas; not these
        bases_in = iter(finish(b, bases_in, staging, keep))
        self.bases: list[Buffer | None] = []
        for it, d in zip(items, self.datas):
            base = next(bases_in) if it[2] is not None else None
            if base is not None and base.nbytes != d.nbytes:
                raise CodecError(f"delta base has {base.nbytes} bytes but data has "
                                 f"{d.nbytes}; a base must be exactly as long as the data")
            self.bases.append(base)
        self.mark("stage in")

    def checksum(self) -> None:
        """XXH3-64 of every input and base (the container's checksums), on the device.
        Launched after the zero-block scan's readback, so that the host does not wait for
        the device to hash every byte before it can go on."""
        hashed = [(d.ptr, d.nbytes) for d in self.inputs] + \
            [(x.ptr, x.nbytes) for x in self.bases if x]
        self.nhashed = len(hashed)
        self.d_hash = hash_buffers(self.b, [p for p, _ in hashed], [n for _, n in hashed],
                                   self.keep)
        self.mark("checksum")

    def zero_blocks(self) -> None:
        """Find the all-zero blocks of every full chunk; a chunk where they are at least
        ``zero_block_share`` of its blocks is coded from its other blocks only (gathered
        into one buffer, hashed again for the self-check), with a keep map in its header."""
        b, keep, profile = self.b, self.keep, self.profile
        n = len(self.datas)
        self.full_len = np.array([d.nbytes for d in self.datas], dtype=np.int64)
        self.zlog = np.zeros(n, dtype=np.int64)
        self.zmaps = np.zeros(0, dtype=np.uint8)
        self.d_zhash = None
        cand = np.array([i for i, (d, x) in enumerate(zip(self.datas, self.bases))
                         if x is None and d.nbytes >= 2 << C.MIN_BLOCK_LOG2], dtype=np.int64)
        if not profile.zero_blocks or not len(cand):
            return
        lens = self.full_len[cand]
        log2 = C.block_log2(lens)
        d_flags, nblocks = block_flags(b, [self.datas[i].ptr for i in cand.tolist()], lens,
                                       log2, keep)
        flags = np.empty(int(nblocks.sum()), dtype=np.uint8)
        b.download(d_flags, 0, flags)
        b.synchronize()
        f0 = np.cumsum(nblocks) - nblocks
        stored = np.add.reduceat(flags, f0, dtype=np.int64)
        # blocks left out: at least the profile's share, and not every block (an all-zero
        # chunk is cheaper as constant planes)
        use = (nblocks - stored >= profile.zero_block_share * nblocks) & (stored > 0)
        if not use.any():
            self.mark("zero blocks")
            return
        uq = np.flatnonzero(use)
        bits, width = C.padded_bits(flags, f0[uq], nblocks[uq])
        (own, off, at, ln), kept = C.kept_runs_many(bits, width, log2[uq], lens[uq])
        slot = (kept + ALIGN - 1) // ALIGN * ALIGN
        base = np.cumsum(slot) - slot
        packed = b.empty(max(int(slot.sum()), 1))
        keep.append(packed)
        pp = b.ptr(packed)
        zq = cand[uq]
        src = np.array([self.datas[i].ptr for i in zq.tolist()], dtype=np.int64)
        seg = Segments()
        seg.add(src[own] + off, pp + base[own] + at, ln)
        seg.launch(b, keep)
        for k, i in enumerate(zq.tolist()):
            self.datas[i] = Buffer(int(pp + base[k]), int(kept[k]))
        self.zlog[zq] = log2[uq]
        self.zmaps = np.packbits(bits, bitorder="little")
        self.d_zhash = hash_buffers(b, [self.datas[i].ptr for i in zq.tolist()],
                                    [self.datas[i].nbytes for i in zq.tolist()], keep)
        self.mark("zero blocks")

    def split(self) -> None:
        """Planes into one scratch buffer (XOR-ing bases on the fly), constant flags, the
        first byte of every plane and the entropy estimates of the codable ones."""
        b, keep, profile = self.b, self.keep, self.profile
        layout = {dt: gpu_layout(dt, profile) for dt in set(self.dts)}
        self.pl = pl = Plan(self.dts, [layout[dt] for dt in self.dts],
                            [d.nbytes for d in self.datas], profile)
        total = pl.place()
        self.nplanes = pl.nplanes
        self.scratch = b.empty(total)
        self.sp = sp = b.ptr(self.scratch)
        self.flags = b.zeros(4 * max(self.nplanes, 1))
        keep += [self.scratch, self.flags]
        self.base_ptr = np.array([x.ptr if x else 0 for x in self.bases], dtype=np.uint64)
        descs = pl.descriptors([d.ptr for d in self.datas], self.base_ptr, sp)
        launch_planes(b, "split", pl, descs, b.ptr(self.flags), keep)
        self.firsts = b.empty(max(self.nplanes, 1))
        seg = Segments()
        seg.add(sp + pl.off, b.ptr(self.firsts) + np.arange(self.nplanes), (pl.raw > 0) * 1)
        seg.launch(b, keep)
        self.coded = np.flatnonzero(pl.spec >= 0)
        self.d_est = sample_entropy(b, sp + pl.off[self.coded], pl.raw[self.coded], keep)
        self.mark("split")

    def readback(self) -> None:
        """One small readback: checksums, constant flags, first bytes, entropy estimates."""
        b, n = self.b, max(self.nplanes, 1)
        self.h_hash = np.empty(self.nhashed, dtype=np.uint64)
        self.h_flags = np.empty(n, dtype=np.uint32)
        self.h_first = np.empty(n, dtype=np.uint8)
        self.h_est = np.empty((max(len(self.coded), 1), 2), dtype=np.float64)
        b.download(self.d_hash, 0, self.h_hash.view(np.uint8))
        b.download(self.flags, 0, self.h_flags.view(np.uint8))
        b.download(self.firsts, 0, self.h_first)
        b.download(self.d_est, 0, self.h_est.reshape(-1).view(np.uint8))
        zq = np.flatnonzero(self.zlog)
        self.h_zhash = np.empty(len(zq), dtype=np.uint64)
        if len(zq):
            b.download(self.d_zhash, 0, self.h_zhash.view(np.uint8))
        b.synchronize()
        # what the self-check restores: the stored blocks of zero-block chunks
        self.check_sums = self.h_hash[: len(self.datas)].copy()
        self.check_sums[zq] = self.h_zhash
        self.mark("readback")

    def choose_codecs(self) -> None:
        """Constant planes and planes the codec cannot shrink skip it; zero-heavy planes
        take the profile's ``zero_chunk`` (or GDeflate's LZ mode, when it asks)."""
        pl, profile, coded = self.pl, self.profile, self.coded
        if not len(coded):
            return
        bits, zero_share = self.h_est[: len(coded), 0], self.h_est[: len(coded), 1]
        drop = (self.h_flags[coded] == 0) | (bits >= profile.max_entropy)
        pl.spec[coded[drop]] = -1
        zc = coded[~drop & (zero_share >= profile.zero_chunk_share)]
        _respec(pl, zc, lambda old: CodecSpec(old.name, old.level, profile.zero_chunk))
        if profile.zero_runs == "gdeflate":
            zr = coded[~drop & (zero_share >= profile.zero_share)]
            _respec(pl, zr, lambda old: CodecSpec("gdeflate", ZERO_RUN_ALGORITHM, old.chunk))

    def code(self) -> None:
        """One nvCOMP batch per codec configuration, over every chunk of its planes."""
        b, pl = self.b, self.pl
        self.batches = batches = {}
        pl.chunk0 = np.zeros(pl.nplanes, dtype=np.int64)
        pl.nch = np.zeros(pl.nplanes, dtype=np.int64)
        pl.comp = np.zeros(pl.nplanes, dtype=np.int64)
        for s in np.unique(pl.spec[pl.spec >= 0]).tolist():
            spec = pl.specs[s]
            group = np.flatnonzero(pl.spec == s)
            offs, raws = pl.off[group], pl.raw[group]
            nch = (raws + spec.chunk - 1) // spec.chunk
            starts = np.cumsum(nch) - nch
            pl.chunk0[group], pl.nch[group] = starts, nch
            idx = np.repeat(np.arange(len(group)), nch)
            within = (np.arange(len(idx)) - starts[idx]) * spec.chunk
            stride = round_up(b.max_compressed(spec), ALIGN)
            dst = b.empty(stride * len(idx))
            self.keep.append(dst)
            comp = b.encode(spec, self.scratch, offs[idx] + within,
                            np.minimum(spec.chunk, raws[idx] - within),
                            dst, stride * np.arange(len(idx)), stride)
            comp = np.asarray(comp, dtype=np.int64)
            batches[s] = {"dst": dst, "stride": stride, "comp": comp,
                          "excl": np.cumsum(comp) - comp}
            pl.comp[group] = np.add.reduceat(comp, starts)
        self.mark("nvcomp")

    def headers(self) -> None:
        """Every plane's final coding and every header, in one metadata buffer; the XOR of
        delta blobs that fall back to one raw plane (rare)."""
        b, datas, bases = self.b, self.datas, self.bases
        self.lay = lay = _decide(self.pl, self.base_ptr != 0, self.batches, self.h_hash,
                                 self.h_flags, self.h_first, b.nvcomp_version,
                                 (self.full_len, self.zlog, self.zmaps))
        self.xor_ptr: dict[int, int] = {}
        if len(lay.fallback):
            tot = 0
            offs = {}
            for i in lay.fallback.tolist():
                offs[i] = tot
                tot = round_up(tot + datas[i].nbytes, ALIGN)
            xb = b.empty(tot)
            self.keep.append(xb)
            for i in lay.fallback.tolist():
                self.xor_ptr[i] = b.ptr(xb) + offs[i]
                b.xor_into(self.xor_ptr[i], datas[i].ptr, bases[i].ptr, datas[i].nbytes)
        self.mark("headers")

    def assemble(self) -> None:
        """Every blob, back to back, with one gather launch."""
        b, keep, sp, pl, lay = self.b, self.keep, self.sp, self.pl, self.lay
        self.blob_len = lay.blob_len
        self.blob_off = np.concatenate([[0], np.cumsum(lay.blob_len)]).astype(np.int64)
        self.size = int(self.blob_off[-1])
        self.out_dev = b.empty(self.size)
        op = b.ptr(self.out_dev)
        h_meta = lay.meta if len(lay.meta) else np.zeros(1, dtype=np.uint8)
        d_meta = b.empty(len(h_meta))
        b.upload(d_meta, 0, h_meta)
        keep += [h_meta, d_meta]
        mp = b.ptr(d_meta)
        seg = Segments()
        at = op + self.blob_off[:-1]
        seg.add(mp + lay.hstart, at, lay.hlen)                      # container headers
        flat = np.flatnonzero(lay.flat)                           # one raw plane
        if len(flat):
            src = np.array([self.datas[i].ptr for i in flat.tolist()], dtype=np.int64)
            delta = self.base_ptr[flat] != 0
            src = np.where(delta, sp + pl.off[pl.p0[flat]], src)   # flat layout: plane 0
            for k, i in enumerate(flat.tolist()):
                if i in self.xor_ptr:
                    src[k] = self.xor_ptr[i]
            seg.add(src, at[flat] + lay.hlen[flat], pl.raw_len[flat])
        q = np.flatnonzero(~lay.flat[pl.job])                      # planes of planar blobs
        pos = at[pl.job[q]] + lay.hlen[pl.job[q]] + lay.pos[q]
        kind = lay.kind[q]
        m = kind == RAW
        seg.add(sp + pl.off[q[m]], pos[m], pl.raw[q[m]])
        m = kind == CONST
        seg.add(mp + lay.extra[q[m]], pos[m], np.ones(int(m.sum()), dtype=np.int64))
        m = kind == CODED
        cq, cpos = q[m], pos[m]
        hs = lay.tsize[cq]
        seg.add(mp + lay.extra[cq], cpos, hs)
        for s, bt in self.batches.items():                       # every coded chunk
            g = np.flatnonzero(pl.spec[cq] == s)
            if not len(g):
                continue
            c0, cn = pl.chunk0[cq[g]], pl.nch[cq[g]]
            idx = np.repeat(np.arange(len(g)), cn)
            k = c0[idx] + (np.arange(len(idx)) - (np.cumsum(cn) - cn)[idx])
            seg.add(b.ptr(bt["dst"]) + bt["stride"] * k,
                    (cpos[g] + hs[g])[idx] + bt["excl"][k] - bt["excl"][c0[idx]], bt["comp"][k])
        seg.launch(b, keep)
        self.mark("assemble")

    def dev_blobs(self) -> list:
        """A device view of every blob (made when asked: each costs a few microseconds)."""
        return self.b.views(self.out_dev, self.blob_off[:-1].tolist(), self.blob_len.tolist())

    def self_check(self) -> None:
        """Decode what was written, on the device, and check it against the checksums: a
        blob that does not restore exactly is never handed out (the CPU codes it)."""
        self.redo: dict[int, bytes] = {}
        if not self.profile.verify:
            return
        items = self.items
        ok = _self_check(self.b, self.pl, self.lay, self.b.ptr(self.out_dev) + self.blob_off[:-1],
                         self.base_ptr, self.check_sums, self.h_first,
                         self.dev_blobs, [it[2] for it in items], self.keep,
                         lambda stage: self.mark("check: " + stage))
        for i in np.flatnonzero(~ok).tolist():
            self.redo[i] = _cpu_blob(items[i][0], self.dts[i], items[i][2])
        self.mark("check: hash")
        if self.redo:
            log.warning("GPU codec: %d of %d blobs did not restore exactly and were coded on "
                        "the CPU instead", len(self.redo), len(self.datas))

    def hand_out(self, out: str) -> list:
        """The blobs: device views, or one copy into pinned host memory."""
        b, redo = self.b, self.redo
        if out == "device":
            b.synchronize()
            blobs = self.dev_blobs()
            for i, blob in redo.items():
                blobs[i] = b.empty(len(blob))
                b.upload(blobs[i], 0, np.frombuffer(blob, dtype=np.uint8))
            b.synchronize()
            return blobs
        host = b.pinned(self.size)
        b.download(self.out_dev, 0, host[: self.size])
        b.synchronize()
        self.mark("copy out")
        views = [host[o: o + n]
                 for o, n in zip(self.blob_off[:-1].tolist(), self.blob_len.tolist())]
        if out == "host":
            return [memoryview(redo[i]) if i in redo else memoryview(v)
                    for i, v in enumerate(views)]
        return [redo[i] if i in redo else v.tobytes() for i, v in enumerate(views)]


def _respec(pl, planes, make) -> None:
    """Code ``planes`` with ``make(their spec)`` instead of their spec."""
    for s in np.unique(pl.spec[planes]).tolist():
        spec = make(pl.specs[s])
        if spec not in pl.specs:
            pl.specs.append(spec)
        pl.spec[planes[pl.spec[planes] == s]] = pl.specs.index(spec)


def _self_check(b, pl, lay, at, base_ptr, sums, h_first, blobs, base_items, keep,
                mark=lambda stage: None) -> np.ndarray:
    """Which blobs decode (on this device) to bytes matching their checksum (``blobs()``
    gives their device views, for the blob-by-blob check).

    Each blob must be read as the decoder reads it, from the header bytes it was given
    (the container headers, constant bytes and nvCOMP payload tables): its planes
    restored by the decoder's own device stages (raw copies, constant fills, every coded
    chunk decoded by nvCOMP with the configuration its payload records), merged with the
    bases, hashed; one readback of the hashes. The device starts on the sources the
    encoder meant to write while the host parses the header bytes (``_as_read``); when
    what they name differs in anything, or a blob is stored flat, the check runs again
    from the parsed sources alone.
    """
    from ._decode import restore_planes
    own = _own_sources(pl, lay, at, h_first)
    if own is None:
        return _check_as_read(b, pl, lay, at, base_ptr, sums, blobs, base_items, keep, mark)
    later: list = []
    try:
        scratch = restore_planes(b, pl, own, keep, mark, later)
    except CodecError:
        return _check_as_read(b, pl, lay, at, base_ptr, sums, blobs, base_items, keep, mark)
    mark("nvcomp")
    got = _restored_sums(b, pl, scratch, base_ptr, keep)
    mark("merge")
    try:                    # while the device works: what a reader finds in the headers
        same = _same_sources(_as_read(pl, lay, at)[1], own, pl)
    except CodecError:
        same = False
    mark("headers")
    b.synchronize()
    try:
        settle(later)
    except CodecError:
        same = False
    if not same:
        return _check_as_read(b, pl, lay, at, base_ptr, sums, blobs, base_items, keep, mark)
    return got == sums


def _check_as_read(b, pl, lay, at, base_ptr, sums, blobs, base_items, keep, mark):
    """The self-check from the parsed header bytes alone (then blob by blob through the
    whole decoder if the decoder refuses any of them)."""
    from ._decode import restore_planes
    try:
        cpl, src = _as_read(pl, lay, at)
        mark("headers")
        scratch = restore_planes(b, cpl, src, keep, mark)
        mark("nvcomp")
    except CodecError:      # a header or chunk the decoder refuses: find its blob the long way
        return np.array(_self_check_each(b, blobs(), base_items), dtype=bool)
    got = _restored_sums(b, cpl, scratch, base_ptr, keep)
    mark("merge")
    b.synchronize()
    return got == sums


def _restored_sums(b, pl, scratch, base_ptr, keep) -> np.ndarray:
    """Merge the restored planes (bases XOR-ed back in) and queue their XXH3 sums back
    into pinned memory: read them after the next ``synchronize``."""
    from ._decode import merge_planes
    out, offs = merge_planes(b, pl, scratch, base_ptr, keep)
    d_got = hash_buffers(b, b.ptr(out) + offs, pl.raw_len, keep)
    got = b.pinned(8 * len(pl)).view(np.uint64)
    b.download(d_got, 0, got.view(np.uint8))
    return got


def _own_sources(pl, lay, at, h_first):
    """The plane sources the encoder meant to write (from its own columns, as the
    decoder's ``Sources``); None when a blob is stored flat (read back as another plan)."""
    from ._decode import CODED as READ_CODED
    from ._decode import COPY, FILL, Sources
    if lay.flat.any():
        return None
    coded, const = lay.kind == CODED, lay.kind == CONST
    job = pl.job
    ptr = np.asarray(at, dtype=np.int64)[job] + lay.hlen[job] + lay.pos + \
        np.where(coded, lay.tsize, 0)
    return Sources(
        kind=np.where(coded, READ_CODED, np.where(const, FILL, COPY)), ptr=ptr,
        val=np.where(const, h_first[: pl.nplanes], 0).astype(np.int64),
        spec=np.where(coded, pl.spec, -1), specs=list(pl.specs),
        counts=np.where(coded, pl.nch, 0), sizes=lay.sizes)


def _same_sources(got, want, pl) -> bool:
    """Whether two ``Sources`` of one plan restore the same bytes: the same kind,
    position, constant, chunk sizes and nvCOMP configuration for every live plane."""
    from ._decode import CODED as READ_CODED
    from ._decode import FILL
    live = pl.raw > 0
    if not np.array_equal(got.kind[live], want.kind[live]):
        return False
    fill = live & (want.kind == FILL)
    coded = live & (want.kind == READ_CODED)
    if not (np.array_equal(got.ptr[live & ~fill], want.ptr[live & ~fill])
            and np.array_equal(got.val[fill], want.val[fill])
            and np.array_equal(got.counts[coded], want.counts[coded])
            and np.array_equal(got.sizes, want.sizes)):
        return False
    if not coded.any():
        return True
    pairs = np.unique(np.stack([got.spec[coded], want.spec[coded]]), axis=1)
    return all(got.specs[i] == want.specs[j] for i, j in pairs.T.tolist())


def _as_read(pl, lay, at):
    """The decoder's plan and plane sources of every assembled blob, from its header bytes
    (``codec._container`` and the payload module read them, as the decoder does); raises
    CodecError for anything the decoder would refuse."""
    from ._decode import plane_sources
    heads, bad = C.unpack_many(lay.meta, lay.hstart, lay.blob_len, lay.hlen)
    if len(bad):
        raise CodecError(f"the encoder wrote {len(bad)} headers its reader refuses")
    codes = heads.dtype_code.tolist()
    cpl = pl.shaped_as(codes, heads.layout, heads.coded_len)
    if cpl is None:
        known = {c: from_code(c) for c in set(codes)}
        cpl = Plan([known[c] for c in codes], heads.layout, heads.coded_len)
    zq = np.flatnonzero(heads.block_log2)
    maps, _ = C.masked_maps(lay.meta, heads.map_at[zq],
                            C.block_counts(heads.raw_len[zq], heads.block_log2[zq]))
    if not (np.array_equal(heads.block_log2, lay.zlog) and np.array_equal(maps, lay.zmaps)):
        raise CodecError("the encoder wrote keep maps the decoder reads otherwise")
    cid, major, enc = heads.codec_id, heads.codec_major, heads.enc_len
    raw, const = cid == P.RAW, cid == P.CONST
    coded = np.isin(cid, list(CODEC_IDS.values()))
    if not (np.array_equal(cpl.np, heads.nplanes) and np.array_equal(cpl.raw, heads.plane_raw)
            and len(lay.hextra) == cpl.nplanes and np.all(raw | const | coded)
            and np.all(major[coded] == 1) and np.all(major[raw] == P.Raw.major)
            and np.all(major[const] == P.Const.major) and np.all(enc[raw] == heads.plane_raw[raw])
            and np.all(enc[const] == 1) and np.array_equal(heads.delta, lay.delta)):
        raise CodecError("the encoder wrote headers the decoder would refuse")
    extra = lay.hextra
    src = plane_sources(heads, cpl, at, lambda q: lay.meta[extra[q]],
                        lambda q: (lay.meta, extra[q]))
    return cpl, src


def _self_check_each(b, blobs: list, bases: list) -> list[bool]:
    """The self-check blob by blob through the whole decoder (a batch that failed)."""
    from ._decode import decompress_many
    ok = []
    for blob, base in zip(blobs, bases):
        try:
            ok += decompress_many([blob], [base], out="check", backend=b)
        except CodecError:
            ok.append(False)
    return ok


def _host_bytes(data) -> memoryview:
    mod = type(data).__module__
    if mod.startswith("cupy") or (hasattr(data, "__cuda_array_interface__")
                                  and not mod.startswith("torch")):
        import cupy
        return memoryview(cupy.asnumpy(cupy.ascontiguousarray(cupy.asarray(data))).reshape(-1)
                          .view(np.uint8))
    from .._buffers import as_bytes
    return as_bytes(data)


def _cpu_blob(data, dt: DType, base) -> bytes:
    from .._cpu import compress_cpu
    return compress_cpu(_host_bytes(data), dt,
                        base=None if base is None else _host_bytes(base))


RAW, CONST, CODED = 0, 1, 2      # a plane's final coding


# long on purpose: one pass over columns that decides every plane's coding and
# writes the headers in the format's order; split, each part would need every column
def _decide(pl: Plan, delta, batches, h_hash, h_flags, h_first, version, zero=None):
    """Pick each plane's coding and write every header into one metadata buffer:
    container headers (``codec._container``), then constant bytes, then nvCOMP payload
    tables. A blob is stored as one raw plane, as ``_cpu.pack_chunk`` does, when coding
    does not pay; its delta needs the XOR then (``fallback``). ``zero``: (every chunk's
    length, block size log2 where it leaves out zero blocks (0: not), keep maps back to
    back); the plan's chunks are then the stored blocks.

    Returns columns: per blob ``flat`` (one raw plane), ``delta``, ``hstart`` / ``hlen``
    (its header in ``meta``), ``blob_len``; per plane of the plan ``kind``, ``pos``
    (offset after the header), ``tsize`` (payload table bytes), ``extra`` (where its
    constant byte or payload table is in ``meta``); ``hextra``: ``extra`` per plane the
    headers list, in their order; ``sizes``: every coded chunk's size, planes in order."""
    nj, npl = len(pl), pl.nplanes
    flag = h_flags[:npl]
    const = (pl.raw >= 2) & (pl.role != TAIL) & (flag == 0)
    tsize = _payload.FIXED_SIZE + 4 * pl.nch
    coded = ~const & (pl.spec >= 0) & (tsize + pl.comp < pl.raw)
    kind = np.where(const, CONST, np.where(coded, CODED, RAW))
    enc = np.where(const, 1, np.where(coded, tsize + pl.comp, pl.raw))
    spec_cid = np.array([CODEC_IDS[s.name] for s in pl.specs] + [0], dtype=np.int64)
    cid = np.where(const, P.CONST, np.where(coded, spec_cid[pl.spec], P.RAW))
    major = np.where(const, P.Const.major, np.where(coded, 1, P.Raw.major))
    if zero is None:
        zero = (pl.raw_len, np.zeros(nj, dtype=np.int64), np.zeros(0, dtype=np.uint8))
    full_len, zlog, zmaps = zero
    zpart = C.zero_part_sizes(full_len, zlog, pl.raw_len)
    flags = np.where(delta, C.FLAG_DELTA, 0) | np.where(zlog > 0, C.FLAG_ZERO_BLOCKS, 0)
    planar = C.header_sizes(delta, full_len, pl.job, pl.raw, enc, zpart) + \
        np.bincount(pl.job, weights=enc, minlength=nj).astype(np.int64)
    one = np.arange(nj)
    flat_len = C.header_sizes(delta, full_len, one, pl.raw_len, pl.raw_len, zpart) + pl.raw_len
    first_raw = np.append(kind, RAW)[pl.p0] == RAW          # (a chunk without planes: raw)
    flat = (planar >= flat_len) | ((pl.layout == _planes.FLAT) & first_raw)
    fallback = np.flatnonzero(flat & delta & (pl.layout != _planes.FLAT))
    # the planes the headers list: a planar blob's own, one raw plane for a flat one
    keep = ~flat[pl.job]
    hb = np.concatenate([pl.job[keep], one[flat]])
    order = np.argsort(hb, kind="stable")
    col = lambda a, b_: np.concatenate([a[keep], b_])[order]
    nf = int(flat.sum())
    sums = h_hash[:nj]
    base_sums = np.zeros(nj, dtype=np.uint64)
    base_sums[delta] = h_hash[nj: nj + int(delta.sum())]
    heads, hstart, hlen = C.header_many(
        [dt.code for dt in pl.dts], flags, np.where(flat, _planes.FLAT, pl.layout), sums,
        base_sums, full_len, hb[order], col(cid, np.full(nf, P.RAW)),
        col(major, np.full(nf, P.Raw.major)), col(pl.raw, pl.raw_len[flat]),
        col(enc, pl.raw_len[flat]), (zlog, pl.raw_len, zmaps))
    # constant bytes, then payload tables, after the headers
    extra = np.full(npl, -1, dtype=np.int64)
    cq = np.flatnonzero(const & keep)
    extra[cq] = len(heads) + np.arange(len(cq))
    tq = np.flatnonzero(coded & keep)
    counts = pl.nch[tq]
    comps = [batches[s]["comp"] for s in sorted(batches)]       # every chunk's size, in one
    allcomp = np.concatenate(comps) if comps else np.zeros(0, dtype=np.int64)
    lens = np.array([len(c) for c in comps], dtype=np.int64)
    gbase = np.zeros(max(batches, default=-1) + 2, dtype=np.int64)
    gbase[sorted(batches)] = np.cumsum(lens) - lens
    c0 = gbase[pl.spec[tq]] + pl.chunk0[tq]
    first = np.cumsum(counts) - counts
    sizes = allcomp[np.repeat(c0 - first, counts) + np.arange(int(counts.sum()))]
    chunk = np.array([s.chunk for s in pl.specs] + [0], dtype=np.int64)[pl.spec[tq]]
    option = np.array([s.option for s in pl.specs] + [0], dtype=np.int64)[pl.spec[tq]]
    tables, tstart = _payload.pack_many(version, option, chunk, sizes, counts)
    extra[tq] = len(heads) + len(cq) + tstart
    hextra = col(extra, np.full(nf, -1, dtype=np.int64))
    meta = np.concatenate([heads, h_first[cq].astype(np.uint8), tables])
    ex = np.cumsum(enc * keep) - enc * keep
    pos = ex - np.append(ex, 0)[pl.p0][pl.job]
    return SimpleNamespace(flat=flat, hstart=hstart, hlen=hlen,
                           blob_len=np.where(flat, flat_len, planar), kind=kind, pos=pos,
                           tsize=tsize, extra=extra, hextra=hextra, meta=meta,
                           fallback=fallback, delta=np.asarray(delta, dtype=bool),
                           sizes=sizes, zlog=zlog, zmaps=zmaps)

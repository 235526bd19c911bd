"""GPU encoder: a whole batch of chunks hashed, split, coded and packed in a few launches.

The stages of one ``compress_many`` call (methods of ``_Encode``, named as in the
benchmark's stage table):

* stage in — inputs on the device (host inputs staged through pinned memory);
* checksum — XXH3-64 of every input and base (3 launches);
* split — planes into one scratch, XOR-ing delta bases on the fly, constant flags, first
  bytes, byte histograms (one launch per plane layout, two small ones);
* readback — one small read of checksums, flags, first bytes and histograms;
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

import numpy as np

from s4fs.errors import CodecError

from .. import _container as C
from .. import _plane_codecs as P
from .. import _planes
from .._dtypes import DType, from_code, lookup
from . import _payload
from ._backend import CodecSpec, round_up
from ._common import (
    ALIGN,
    CODEC_IDS,
    Buffer,
    Segments,
    Staging,
    descriptors,
    entropy_bits,
    finish,
    gpu_layout,
    hash_buffers,
    launch_planes,
    place,
    plan,
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
        """XXH3-64 of every input and base (the container's checksums), on the device."""
        hashed = [(d.ptr, d.nbytes) for d in self.datas] + \
            [(x.ptr, x.nbytes) for x in self.bases if x]
        self.nhashed = len(hashed)
        self.d_hash = hash_buffers(self.b, [p for p, _ in hashed], [n for _, n in hashed],
                                   self.keep)
        self.mark("checksum")

    def split(self) -> None:
        """Planes into one scratch buffer (XOR-ing bases on the fly), constant flags, the
        first byte of every plane and byte histograms of the codable ones."""
        b, keep, profile = self.b, self.keep, self.profile
        self.jobs = jobs = [plan(dt, gpu_layout(dt, profile), d.nbytes, profile)
                            for dt, d in zip(self.dts, self.datas)]
        total, self.nplanes = place(jobs)
        self.scratch = b.empty(total)
        self.sp = sp = b.ptr(self.scratch)
        self.flags = b.zeros(4 * max(self.nplanes, 1))
        keep += [self.scratch, self.flags]
        descs = descriptors(jobs, [d.ptr for d in self.datas],
                            [x.ptr if x else 0 for x in self.bases], sp)
        launch_planes(b, "split", jobs, descs, b.ptr(self.flags), keep)
        self.planes = planes = [p for j in jobs for p in j.planes]
        self.firsts = b.empty(max(self.nplanes, 1))
        seg = Segments()
        seg.add([sp + p.off for p in planes], b.ptr(self.firsts) + np.arange(self.nplanes),
                [1 if p.raw else 0 for p in planes])
        seg.launch(b, keep)
        self.coded = [k for k, p in enumerate(planes) if p.spec is not None]
        self.d_hist = sample_entropy(b, [sp + planes[k].off for k in self.coded],
                                     [planes[k].raw for k in self.coded], keep)
        self.mark("split")

    def readback(self) -> None:
        """One small readback: checksums, constant flags, first bytes, histograms."""
        b, n = self.b, max(self.nplanes, 1)
        self.h_hash = np.empty(self.nhashed, dtype=np.uint64)
        self.h_flags = np.empty(n, dtype=np.uint32)
        self.h_first = np.empty(n, dtype=np.uint8)
        self.h_hist = np.empty(256 * max(len(self.coded), 1), dtype=np.uint32)
        b.download(self.d_hash, 0, self.h_hash.view(np.uint8))
        b.download(self.flags, 0, self.h_flags.view(np.uint8))
        b.download(self.firsts, 0, self.h_first)
        b.download(self.d_hist, 0, self.h_hist.view(np.uint8))
        b.synchronize()
        self.mark("readback")

    def choose_codecs(self) -> None:
        """Constant planes and planes the codec cannot shrink skip it; zero-heavy planes
        take GDeflate's LZ mode when the profile asks."""
        profile = self.profile
        bits = entropy_bits(self.h_hist)
        rows = self.h_hist.reshape(-1, 256)
        zero_share = rows[:, 0] / np.maximum(rows.sum(axis=1), 1)
        for k, h, z in zip(self.coded, bits, zero_share):
            p = self.planes[k]
            if self.h_flags[k] == 0 or h >= profile.max_entropy:
                p.spec = None
            elif profile.zero_runs == "gdeflate" and z >= profile.zero_share:
                p.spec = CodecSpec("gdeflate", ZERO_RUN_ALGORITHM, p.spec.chunk)

    def code(self) -> None:
        """One nvCOMP batch per codec configuration, over every chunk of its planes."""
        b = self.b
        self.batches = batches = {}
        for p in self.planes:
            if p.spec is not None:
                batches.setdefault(p.spec, {"planes": []})["planes"].append(p)
        for spec, bt in batches.items():
            group = bt["planes"]
            offs = np.fromiter((p.off for p in group), np.int64, len(group))
            raws = np.fromiter((p.raw for p in group), np.int64, len(group))
            nch = (raws + spec.chunk - 1) // spec.chunk
            starts = np.cumsum(nch) - nch
            for p, s0, c in zip(group, starts.tolist(), nch.tolist()):
                p.chunk0, p.nchunks = s0, c
            idx = np.repeat(np.arange(len(group)), nch)
            within = (np.arange(len(idx)) - starts[idx]) * spec.chunk
            stride = round_up(b.max_compressed(spec), ALIGN)
            dst = b.empty(stride * len(idx))
            self.keep.append(dst)
            bt["dst"], bt["stride"] = dst, stride
            bt["comp"] = comp = b.encode(spec, self.scratch, (offs[idx] + within).tolist(),
                                         np.minimum(spec.chunk, raws[idx] - within).tolist(),
                                         dst, (stride * np.arange(len(idx))).tolist(), stride)
            bt["excl"] = np.cumsum(comp) - comp
            for p, total_c in zip(group, np.add.reduceat(comp, starts).tolist()):
                p.comp = total_c
        self.mark("nvcomp")

    def headers(self) -> None:
        """Every plane's final coding and every header, in one metadata buffer; the XOR of
        delta blobs that fall back to one raw plane (rare)."""
        b, datas, bases = self.b, self.datas, self.bases
        self.layouts, self.meta, fallback = _decide(
            self.jobs, bases, self.batches, self.h_hash, self.h_flags, self.h_first,
            b.nvcomp_version, len(datas))
        self.xor_ptr: dict[int, int] = {}
        if fallback:
            tot = 0
            offs = {}
            for i in fallback:
                offs[i] = tot
                tot = round_up(tot + datas[i].nbytes, ALIGN)
            xb = b.empty(tot)
            self.keep.append(xb)
            for i in fallback:
                self.xor_ptr[i] = b.ptr(xb) + offs[i]
                b.xor_into(self.xor_ptr[i], datas[i].ptr, bases[i].ptr, datas[i].nbytes)
        self.mark("headers")

    def assemble(self) -> None:
        """Every blob, back to back, with one gather launch."""
        b, keep, sp = self.b, self.keep, self.sp
        self.blob_len = [lay[3] for lay in self.layouts]
        self.blob_off = np.concatenate([[0], np.cumsum(self.blob_len)]).astype(np.int64)
        self.size = int(self.blob_off[-1])
        self.out_dev = b.empty(self.size)
        op = b.ptr(self.out_dev)
        h_meta = np.frombuffer(bytes(self.meta) or b"\0", dtype=np.uint8).copy()
        d_meta = b.empty(len(h_meta))
        b.upload(d_meta, 0, h_meta)
        keep += [h_meta, d_meta]
        mp = b.ptr(d_meta)
        seg = Segments()
        chunk_runs: dict[CodecSpec, list] = {spec: [] for spec in self.batches}
        for i, (j, (moff, mlen, entries, _)) in enumerate(zip(self.jobs, self.layouts)):
            pos = op + int(self.blob_off[i])
            seg.add(mp + moff, pos, mlen)
            pos += mlen
            if entries is None:               # one raw plane of the data (or of the XOR)
                if i in self.xor_ptr:
                    src = self.xor_ptr[i]
                elif self.bases[i] is not None:   # flat layout: plane 0 holds the XOR
                    src = sp + j.planes[0].off
                else:
                    src = self.datas[i].ptr
                seg.add(src, pos, j.raw_len)
                continue
            for p, (kind, enc, where) in zip(j.planes, entries):
                if kind == "raw":
                    seg.add(sp + p.off, pos, p.raw)
                elif kind == "const":
                    seg.add(mp + where, pos, 1)
                else:
                    hlen = _payload.header_size(p.raw, p.spec.chunk)
                    seg.add(mp + where, pos, hlen)
                    chunk_runs[p.spec].append((p.chunk0, p.nchunks, pos + hlen))
                pos += enc
        for spec, runs in chunk_runs.items():       # every coded chunk, vectorized
            if not runs:
                continue
            bt = self.batches[spec]
            c0, cn, at = (np.asarray(x, dtype=np.int64) for x in zip(*runs))
            idx = np.repeat(np.arange(len(runs)), cn)
            k = c0[idx] + (np.arange(len(idx)) - (np.cumsum(cn) - cn)[idx])
            seg.add(b.ptr(bt["dst"]) + bt["stride"] * k,
                    at[idx] + bt["excl"][k] - bt["excl"][c0[idx]], bt["comp"][k])
        seg.launch(b, keep)
        self.dev_blobs = [b.view(self.out_dev, int(self.blob_off[i]), self.blob_len[i])
                          for i in range(len(self.jobs))]
        self.mark("assemble")

    def self_check(self) -> None:
        """Decode what was written, on the device, and check it against the checksums: a
        blob that does not restore exactly is never handed out (the CPU codes it)."""
        self.redo: dict[int, bytes] = {}
        if not self.profile.verify:
            return
        items = self.items
        ok = _self_check(self.b, self.layouts, self.meta,
                         self.b.ptr(self.out_dev) + self.blob_off[:-1], self.bases,
                         self.h_hash[: len(self.datas)], self.dev_blobs,
                         [it[2] for it in items], self.keep)
        for i in (i for i, good in enumerate(ok) if not good):
            self.redo[i] = _cpu_blob(items[i][0], self.dts[i], items[i][2])
        self.mark("self-check")
        if self.redo:
            log.warning("GPU codec: %d of %d blobs did not restore exactly and were coded on "
                        "the CPU instead", len(self.redo), len(self.jobs))

    def hand_out(self, out: str) -> list:
        """The blobs: device views, or one copy into pinned host memory."""
        b, redo = self.b, self.redo
        if out == "device":
            b.synchronize()
            blobs = list(self.dev_blobs)
            for i, blob in redo.items():
                blobs[i] = b.empty(len(blob))
                b.upload(blobs[i], 0, np.frombuffer(blob, dtype=np.uint8))
            b.synchronize()
            return blobs
        host = b.pinned(self.size)
        b.download(self.out_dev, 0, host[: self.size])
        b.synchronize()
        self.mark("copy out")
        off, ln = self.blob_off, self.blob_len
        views = [host[int(off[i]): int(off[i]) + ln[i]] for i in range(len(self.jobs))]
        if out == "host":
            return [memoryview(redo[i]) if i in redo else memoryview(v)
                    for i, v in enumerate(views)]
        return [redo[i] if i in redo else v.tobytes() for i, v in enumerate(views)]


def _self_check(b, layouts, meta, at, bases, sums, blobs, base_items, keep) -> list[bool]:
    """Which blobs decode (on this device) to bytes matching their checksum.

    Each blob is read as the decoder reads it, from the header bytes it was given (the
    container header, constant bytes and nvCOMP payload tables, parsed from the host copy
    they were gathered from, so no device reads): its planes restored by the decoder's
    own device stages (raw copies, constant fills, every coded chunk decoded by nvCOMP
    with the configuration its payload records), merged with the bases, hashed; one
    readback of the hashes.
    """
    from ._decode import merge_planes, restore_planes
    try:
        cjobs, rows = _as_read(layouts, meta, at)
        scratch = restore_planes(b, cjobs, rows, keep)
    except CodecError:      # a header or chunk the decoder refuses: find its blob the long way
        return _self_check_each(b, blobs, base_items)
    out, offs = merge_planes(b, cjobs, scratch, [x.ptr if x else 0 for x in bases], keep)
    optr = b.ptr(out)
    d_got = hash_buffers(b, [optr + o for o in offs], [j.raw_len for j in cjobs], keep)
    got = np.empty(len(cjobs), dtype=np.uint64)
    b.download(d_got, 0, got.view(np.uint8))
    b.synchronize()
    return (got == sums).tolist()


def _as_read(layouts, meta, at):
    """The decoder's plan and plane sources of every assembled blob, from its header bytes."""
    from ._decode import spec_for
    mv = memoryview(meta)
    cjobs, rows = [], []
    for (moff, mlen, entries, blen), pos in zip(layouts, at.tolist()):
        head = C.unpack(mv[moff: moff + mlen], whole=False, total=blen)
        pos += head.payload_offset
        if entries is None:
            entries = [("raw", head.raw_len, 0)]
        cjobs.append(plan(from_code(head.dtype_code), head.layout, head.raw_len))
        row = []
        for ph, (_, _, where) in zip(head.planes, entries):
            if ph.codec_id == P.RAW:
                row.append(("copy", pos))
            elif ph.codec_id == P.CONST:
                row.append(("fill", meta[where]))
            else:
                ptab = _payload.parse_table(mv[where:], ph.enc_len, ph.raw_len,
                                            P.codec_name(ph.codec_id))
                row.append(("coded", spec_for(ph.codec_id, ptab), ptab.sizes,
                            pos + ptab.data_offset))
            pos += ph.enc_len
        rows.append(row)
    return cjobs, rows


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


def _decide(jobs, bases, batches, h_hash, h_flags, h_first, version, ndata):
    """Pick each plane's coding and write every header into one metadata buffer.

    Returns per blob ``(meta offset, header length, entries or None, blob length)``
    (``None``: stored as one raw plane, as ``_cpu.pack_chunk`` does when coding does
    not pay), the metadata bytes, and the delta blobs whose raw fallback needs the XOR.
    """
    meta = bytearray()
    layouts = []
    fallback = []
    base_sums = iter(int(h) for h in h_hash[ndata:])
    for i, j in enumerate(jobs):
        checksum = int(h_hash[i])
        bsum = next(base_sums) if bases[i] is not None else None
        flag_bits = C.FLAG_DELTA if bsum is not None else 0
        planes, entries, extra = [], [], []
        for k, p in enumerate(j.planes):
            idx = j.flag0 + k
            if p.raw >= 2 and p.role != "tail" and h_flags[idx] == 0:
                planes.append((P.CONST, P.Const.major, p.raw, 1))
                entries.append(["const", 1, bytes((int(h_first[idx]),))])
                continue
            if p.spec is not None:
                enc = _payload.header_size(p.raw, p.spec.chunk) + p.comp
                if enc < p.raw:
                    sizes = batches[p.spec]["comp"][p.chunk0: p.chunk0 + p.nchunks]
                    planes.append((CODEC_IDS[p.spec.name], 1, p.raw, enc))
                    entries.append(["coded", enc, _payload.pack_header(
                        version, p.spec.option, p.spec.chunk, sizes)])
                    continue
            planes.append((P.RAW, P.Raw.major, p.raw, p.raw))
            entries.append(["raw", p.raw, b""])
        head = C.header(j.dt.code, flag_bits, j.layout, checksum, bsum, j.raw_len, planes)
        planar = len(head) + sum(e[1] for e in entries)
        flat = C.header_size(flag_bits, j.raw_len, [(j.raw_len, j.raw_len)]) + j.raw_len
        if planar >= flat or (j.layout == _planes.FLAT and entries[0][0] == "raw"):
            flat_head = C.header(j.dt.code, flag_bits, _planes.FLAT, checksum, bsum,
                                 j.raw_len, [(P.RAW, P.Raw.major, j.raw_len, j.raw_len)])
            layouts.append((len(meta), len(flat_head), None, flat))
            meta += flat_head
            if bases[i] is not None and j.layout != _planes.FLAT:
                fallback.append(i)
            continue
        layouts.append((len(meta), len(head), [], planar))
        meta += head
        for kind, enc, extra in entries:
            layouts[-1][2].append((kind, enc, len(meta)))
            meta += extra
    return layouts, meta, fallback

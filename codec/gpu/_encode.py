"""GPU encoder: a whole batch of chunks hashed, split, coded and packed in a few launches.

inputs on the device (host inputs staged through pinned memory) → XXH3 of every input
and base (3 launches) → split into planes, XOR-ing delta bases on the fly and flagging
constant planes (one launch per plane layout) → one nvCOMP batch per codec over every
chunk of every plane → one small readback (compressed sizes, flags, checksums) →
headers written on the host → one gather launch packs every blob back to back →
blobs stay on the device, or come back in one copy to pinned host memory.
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
from ._common import (ALIGN, CODEC_IDS, Buffer, Segments, Staging,
                      descriptors, entropy_bits, finish, gpu_layout, hash_buffers, launch_planes,
                      place, plan, resolve, sample_entropy)
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
    b = backend or cuda_backend()
    dts = [d if isinstance(d, DType) else lookup(d) for _, d, _ in items]
    keep: list = []
    mark = timer.mark if timer is not None else (lambda stage: None)

    # inputs and bases on the device
    staging = Staging(b)
    datas = resolve(b, [it[0] for it in items], staging, keep)
    bases_in = resolve(b, [it[2] for it in items if it[2] is not None], staging, keep)
    staging.flush()
    keep.append(staging)
    datas = finish(b, datas, staging, keep)
    bases_in = iter(finish(b, bases_in, staging, keep))
    bases: list[Buffer | None] = []
    for it, d in zip(items, datas):
        base = next(bases_in) if it[2] is not None else None
        if base is not None and base.nbytes != d.nbytes:
            raise CodecError(f"delta base has {base.nbytes} bytes but data has {d.nbytes}; "
                             f"a base must be exactly as long as the data")
        bases.append(base)
    mark("stage in")

    # checksums, planes, constant flags
    hashed = [(d.ptr, d.nbytes) for d in datas] + [(x.ptr, x.nbytes) for x in bases if x]
    d_hash = hash_buffers(b, [p for p, _ in hashed], [n for _, n in hashed], keep)
    mark("checksum")
    jobs = [plan(dt, gpu_layout(dt, profile), d.nbytes, profile) for dt, d in zip(dts, datas)]
    total, nplanes = place(jobs)
    scratch = b.empty(total)
    sp = b.ptr(scratch)
    flags = b.zeros(4 * max(nplanes, 1))
    keep += [scratch, flags]
    descs = descriptors(jobs, [d.ptr for d in datas], [x.ptr if x else 0 for x in bases], sp)
    launch_planes(b, "split", jobs, descs, b.ptr(flags), keep)
    planes = [p for j in jobs for p in j.planes]
    firsts = b.empty(max(nplanes, 1))
    seg = Segments()
    seg.add([sp + p.off for p in planes], b.ptr(firsts) + np.arange(nplanes),
            [1 if p.raw else 0 for p in planes])
    seg.launch(b, keep)
    coded = [k for k, p in enumerate(planes) if p.spec is not None]
    d_hist = sample_entropy(b, [sp + planes[k].off for k in coded],
                            [planes[k].raw for k in coded], keep)
    mark("split")

    # one readback: checksums, constant flags, first bytes, byte histograms
    h_hash = np.empty(len(hashed), dtype=np.uint64)
    h_flags = np.empty(max(nplanes, 1), dtype=np.uint32)
    h_first = np.empty(max(nplanes, 1), dtype=np.uint8)
    h_hist = np.empty(256 * max(len(coded), 1), dtype=np.uint32)
    b.download(d_hash, 0, h_hash.view(np.uint8))
    b.download(flags, 0, h_flags.view(np.uint8))
    b.download(firsts, 0, h_first)
    b.download(d_hist, 0, h_hist.view(np.uint8))
    b.synchronize()
    mark("readback")

    # constant planes and planes the codec cannot shrink skip it
    bits = entropy_bits(h_hist)
    rows = h_hist.reshape(-1, 256)
    zero_share = rows[:, 0] / np.maximum(rows.sum(axis=1), 1)
    for k, h, z in zip(coded, bits, zero_share):
        p = planes[k]
        if h_flags[k] == 0 or h >= profile.max_entropy:
            p.spec = None
        elif profile.zero_runs == "gdeflate" and z >= profile.zero_share:
            p.spec = CodecSpec("gdeflate", ZERO_RUN_ALGORITHM, p.spec.chunk)

    # one nvCOMP batch per codec configuration, over every chunk of its planes
    batches: dict[CodecSpec, dict] = {}
    for p in planes:
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
        keep.append(dst)
        bt["dst"], bt["stride"] = dst, stride
        bt["comp"] = comp = b.encode(spec, scratch, (offs[idx] + within).tolist(),
                                     np.minimum(spec.chunk, raws[idx] - within).tolist(), dst,
                                     (stride * np.arange(len(idx))).tolist(), stride)
        bt["excl"] = np.cumsum(comp) - comp
        for p, total_c in zip(group, np.add.reduceat(comp, starts).tolist()):
            p.comp = total_c

    mark("nvcomp")
    layouts, meta, fallback = _decide(jobs, bases, batches, h_hash, h_flags, h_first,
                                      b.nvcomp_version, len(datas))

    # delta chunks that fall back to one raw plane need the XOR itself (rare)
    xor_ptr: dict[int, int] = {}
    if fallback:
        tot = 0
        offs = {}
        for i in fallback:
            offs[i] = tot
            tot = round_up(tot + datas[i].nbytes, ALIGN)
        xb = b.empty(tot)
        keep.append(xb)
        for i in fallback:
            xor_ptr[i] = b.ptr(xb) + offs[i]
            b.xor_into(xor_ptr[i], datas[i].ptr, bases[i].ptr, datas[i].nbytes)

    mark("headers")

    # assemble every blob with one gather
    blob_len = [lay[3] for lay in layouts]
    blob_off = np.concatenate([[0], np.cumsum(blob_len)]).astype(np.int64)
    size = int(blob_off[-1])
    out_dev = b.empty(size)
    op = b.ptr(out_dev)
    h_meta = np.frombuffer(bytes(meta) or b"\0", dtype=np.uint8).copy()
    d_meta = b.empty(len(h_meta))
    b.upload(d_meta, 0, h_meta)
    keep += [h_meta, d_meta]
    mp = b.ptr(d_meta)
    seg = Segments()
    chunk_runs: dict[CodecSpec, list] = {spec: [] for spec in batches}
    for i, (j, (moff, mlen, entries, _)) in enumerate(zip(jobs, layouts)):
        pos = op + int(blob_off[i])
        seg.add(mp + moff, pos, mlen)
        pos += mlen
        if entries is None:               # one raw plane of the data (or of the XOR)
            if i in xor_ptr:
                src = xor_ptr[i]
            elif bases[i] is not None:    # flat layout: plane 0 holds the XOR
                src = sp + j.planes[0].off
            else:
                src = datas[i].ptr
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
        bt = batches[spec]
        c0, cn, at = (np.asarray(x, dtype=np.int64) for x in zip(*runs))
        idx = np.repeat(np.arange(len(runs)), cn)
        k = c0[idx] + (np.arange(len(idx)) - (np.cumsum(cn) - cn)[idx])
        seg.add(b.ptr(bt["dst"]) + bt["stride"] * k,
                at[idx] + bt["excl"][k] - bt["excl"][c0[idx]], bt["comp"][k])
    seg.launch(b, keep)
    mark("assemble")

    dev_blobs = [b.view(out_dev, int(blob_off[i]), blob_len[i]) for i in range(len(jobs))]
    redo: dict[int, bytes] = {}
    if profile.verify:
        # decode what was written, on the device, and check it against the checksums:
        # a blob that does not restore exactly is never handed out (the CPU codes it)
        ok = _self_check(b, layouts, meta, op + blob_off[:-1], bases, h_hash[: len(datas)],
                         dev_blobs, [it[2] for it in items], keep)
        for i in (i for i, good in enumerate(ok) if not good):
            redo[i] = _cpu_blob(items[i][0], dts[i], items[i][2])
        mark("self-check")
        if redo:
            log.warning("GPU codec: %d of %d blobs did not restore exactly and were coded on "
                        "the CPU instead", len(redo), len(jobs))
    if out == "device":
        b.synchronize()
        for i, blob in redo.items():
            dev_blobs[i] = b.empty(len(blob))
            b.upload(dev_blobs[i], 0, np.frombuffer(blob, dtype=np.uint8))
        b.synchronize()
        return dev_blobs
    host = b.pinned(size)
    b.download(out_dev, 0, host[:size])
    b.synchronize()
    mark("copy out")
    views = [host[int(blob_off[i]): int(blob_off[i]) + blob_len[i]] for i in range(len(jobs))]
    if out == "host":
        return [memoryview(redo[i]) if i in redo else memoryview(v) for i, v in enumerate(views)]
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
                name = P.codec_name(ph.codec_id)
                ptab = _payload.parse_table(mv[where: where + _payload.header_size(
                    ph.raw_len, _payload.FIXED.unpack_from(mv, where)[4])], ph.enc_len,
                    ph.raw_len, name)
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

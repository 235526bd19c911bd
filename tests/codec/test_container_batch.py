"""The batch header writer and readers (``codec._container.header_many`` / ``unpack_many``,
``codec._nvcomp_payload.pack_many`` / ``parse_many``) against the one-at-a-time definitions:
the same bytes written, the same fields read, and every blob the scalar reader refuses
refused (the caller then asks the scalar reader why)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from s4fs.codec import _container as C
from s4fs.codec import _nvcomp_payload as Y

EDGES = [0, 1, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21, (1 << 32) + 5]


def _blob(rng: random.Random):
    """Header arguments of a random blob: a delta, a chunk with zero blocks (a random keep
    map), or neither."""
    kind = rng.choice(["delta", "zero blocks", "plain"])
    planes = [(rng.randint(0, 255), rng.randint(0, 3), rng.choice(EDGES + [rng.getrandbits(40)]),
               rng.choice(EDGES + [rng.getrandbits(33)])) for _ in range(rng.randint(0, 9))]
    raw_len = rng.choice(EDGES + [rng.getrandbits(50)])
    flags, zero = 0, None
    if kind == "delta":
        flags = C.FLAG_DELTA
    elif kind == "zero blocks":
        raw_len = rng.choice(EDGES[:-1] + [(1 << 32) + 5, rng.getrandbits(26)])
        log2 = C.block_log2(raw_len)
        nblocks = -(-raw_len >> log2)
        bits = np.array([rng.random() < 0.6 for _ in range(nblocks)], dtype=np.uint8)
        keep_map = np.packbits(bits, bitorder="little").tobytes()
        flags = C.FLAG_ZERO_BLOCKS
        zero = (log2, C.kept_length(keep_map, raw_len, 1 << log2), keep_map)
    return (rng.randint(0, 40), flags, rng.randint(0, 5), rng.getrandbits(64),
            rng.getrandbits(64) if kind == "delta" else None, raw_len, planes, zero)


def _columns(blobs):
    pb = [i for i, b in enumerate(blobs) for _ in b[6]]
    col = [[p[k] for b in blobs for p in b[6]] for k in range(4)]
    return pb, col


def _zero_columns(blobs):
    """``header_many``'s zero_blocks argument for the blobs."""
    log2 = [b[7][0] if b[7] else 0 for b in blobs]
    kept = [b[7][1] if b[7] else 0 for b in blobs]
    maps = np.frombuffer(b"".join(b[7][2] for b in blobs if b[7]), dtype=np.uint8)
    return log2, kept, maps


@pytest.mark.parametrize("seed", range(6))
def test_header_many_writes_what_header_writes(seed):
    rng = random.Random(seed)
    for _ in range(40):
        blobs = [_blob(rng) for _ in range(rng.randint(1, 30))]
        ref = [C.header(*b) for b in blobs]
        pb, col = _columns(blobs)
        out, starts, lens = C.header_many(
            [b[0] for b in blobs], [b[1] for b in blobs], [b[2] for b in blobs],
            [b[3] for b in blobs], [b[4] or 0 for b in blobs], [b[5] for b in blobs], pb, *col,
            _zero_columns(blobs))
        assert out.tobytes() == b"".join(ref)
        assert lens.tolist() == [len(r) for r in ref]
        assert starts.tolist() == np.cumsum([0] + [len(r) for r in ref])[:-1].tolist()
        log2, kept, _ = _zero_columns(blobs)
        sizes = C.header_sizes([b[1] & C.FLAG_DELTA for b in blobs], [b[5] for b in blobs], pb,
                               col[2], col[3],
                               C.zero_part_sizes([b[5] for b in blobs], log2, kept))
        assert sizes.tolist() == [len(r) for r in ref]


@pytest.mark.parametrize("seed", range(6))
def test_unpack_many_reads_what_unpack_reads(seed):
    rng = random.Random(100 + seed)
    for _ in range(40):
        blobs = [_blob(rng) for _ in range(rng.randint(1, 30))]
        ref = [C.header(*b) for b in blobs]
        totals = [len(r) + sum(p[3] for p in b[6]) for r, b in zip(ref, blobs)]
        starts = np.cumsum([0] + [len(r) for r in ref])[:-1]
        heads, bad = C.unpack_many(b"".join(ref), starts, totals, [len(r) for r in ref])
        assert bad.tolist() == []
        for i, r in enumerate(ref):
            u = C.unpack(r, whole=False, total=totals[i])
            assert (heads.dtype_code[i], heads.flags[i], heads.layout[i], int(heads.checksum[i]),
                    int(heads.raw_len[i]), heads.payload_offset[i]) == \
                (u.dtype_code, u.flags, u.layout, u.checksum, u.raw_len, u.payload_offset)
            assert int(heads.base_checksum[i]) == (u.base_checksum or 0)
            assert (1 << int(heads.block_log2[i]) if heads.block_log2[i] else 0) == u.block
            assert int(heads.kept_len[i]) == u.coded_len
            at, n = int(heads.map_at[i]), int(heads.map_len[i])
            assert b"".join(ref)[at: at + n] == u.keep_map
            q = range(heads.plane0[i], heads.plane0[i] + heads.nplanes[i])
            assert [(heads.codec_id[k], heads.codec_major[k], heads.plane_raw[k],
                     heads.enc_len[k]) for k in q] == \
                [(p.codec_id, p.codec_major, p.raw_len, p.enc_len) for p in u.planes]
            pos = u.payload_offset + np.cumsum([0] + [p.enc_len for p in u.planes])[:-1]
            assert heads.pos[list(q)].tolist() == pos.tolist()


def test_unpack_many_refuses_what_unpack_refuses():
    """Flipped bits, truncated headers, wrong totals: every blob ``unpack`` refuses is
    among the refused ones."""
    rng = random.Random(7)
    refused = 0
    for trial in range(1500):
        b = _blob(rng)
        r = bytearray(C.header(*b))
        total = len(r) + sum(p[3] for p in b[6])
        kind = trial % 3
        if kind == 0:
            r[rng.randrange(len(r))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            r = r[: rng.randrange(len(r) + 1)]
        else:
            total += rng.choice([-1, 1])
        _, bad = C.unpack_many(bytes(r) + bytes(rng.randrange(4)), [0], [total], [len(r)])
        try:
            C.unpack(bytes(r), whole=False, total=total)
        except Exception:
            assert bad.tolist() == [0], (trial, kind)
            refused += 1
    assert refused > 900


def test_payload_tables_many_are_the_single_ones():
    rng = random.Random(3)
    for _ in range(200):
        planes = []
        for _ in range(rng.randint(1, 20)):
            chunk = rng.choice([1, 7, 65536, 262144])
            raw = rng.randint(0, 10 * chunk)
            sizes = [rng.randint(0, 1000) for _ in range(Y.nchunks(raw, chunk))]
            planes.append((rng.randint(0, 255), chunk, raw, sizes))
        ref = [Y.pack_header((6, 0, 1), o, c, s) for o, c, _, s in planes]
        out, starts = Y.pack_many((6, 0, 1), [p[0] for p in planes], [p[1] for p in planes],
                                  [x for p in planes for x in p[3]], [len(p[3]) for p in planes])
        assert out.tobytes() == b"".join(ref)
        assert starts.tolist() == np.cumsum([0] + [len(r) for r in ref])[:-1].tolist()
        buf = b"".join(r + bytes(sum(p[3])) for r, p in zip(ref, planes))
        at = np.cumsum([0] + [len(r) + sum(p[3]) for r, p in zip(ref, planes)])[:-1]
        enc = [len(r) + sum(p[3]) for r, p in zip(ref, planes)]
        if rng.random() < 0.3:                      # one payload length that lies
            enc[rng.randrange(len(enc))] += rng.choice([-1, 1])
        option, chunk, version, counts, sizes, bad = Y.parse_many(buf, at, enc,
                                                                  [p[2] for p in planes])
        first = np.cumsum(counts) - counts
        for i, p in enumerate(planes):
            try:
                h = Y.parse_table(memoryview(buf)[int(at[i]):], enc[i], p[2], "nvcomp-ans")
            except Exception:
                assert i in bad
                continue
            assert i not in bad
            assert (option[i], chunk[i], tuple(version[i]), counts[i]) == \
                (h.option, h.chunk, h.version, h.nchunks)
            assert sizes[first[i]: first[i] + counts[i]].tolist() == h.sizes.tolist()


def test_parse_many_reads_no_further_than_each_piece():
    """A table cut short in its piece is refused, even though the next piece's bytes
    follow it in the buffer."""
    a = Y.pack_header((6, 0, 0), 0, 256, [10, 10, 10])
    b = Y.pack_header((6, 0, 0), 0, 256, [5])
    buf = a[:-4] + b
    enc = [len(a) + 30, len(b) + 5]
    *_, bad = Y.parse_many(buf, [0, len(a) - 4], enc, [3 * 256, 256], [len(a) - 4, len(b)])
    assert bad.tolist() == [0]
    *_, bad = Y.parse_many(a + b, [0, len(a)], enc, [3 * 256, 256], [len(a), len(b)])
    assert bad.tolist() == []


def test_zero_block_headers_refuse_what_no_writer_writes():
    """A keep map that disagrees with the kept length, a block size out of range, or
    zero blocks on a delta: both readers refuse the blob with a clear error."""
    from s4fs.errors import FormatError
    keep_map = bytes([0b101])
    good = C.header(1, C.FLAG_ZERO_BLOCKS, 0, 5, None, 3 * 4096, [(0, 1, 8192, 8192)],
                    (12, 8192, keep_map))
    assert C.unpack(good + bytes(8192)).kept_len == 8192
    at = good.index(bytes([12]), 18)
    wrong_kept = C.header(1, C.FLAG_ZERO_BLOCKS, 0, 5, None, 3 * 4096, [(0, 1, 4096, 4096)],
                          (12, 4096, keep_map))
    small_block = bytearray(good)
    small_block[at] = 11
    both = bytearray(good)
    both[7] |= C.FLAG_DELTA
    for blob, n, what in [(wrong_kept, 4096, "keep map"), (bytes(small_block), 8192, "block"),
                          (bytes(both), 8192, "delta")]:
        with pytest.raises(FormatError, match=what):
            C.unpack(blob + bytes(n))
        _, bad = C.unpack_many(blob + bytes(n), [0], [len(blob) + n])
        assert bad.tolist() == [0], what
    with pytest.raises(ValueError):
        C.header(1, C.FLAG_ZERO_BLOCKS | C.FLAG_DELTA, 0, 5, 6, 3 * 4096, [], (12, 8192, keep_map))

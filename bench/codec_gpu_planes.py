"""Where the GPU codec stores more than the CPU path, plane by plane (H200 box).

The data is bench/codec_gpu.py's (real MiniLM tensors tiled on the device, every tensor
cut on its own as s4fs cuts storages). Every chunk (or the first ``--sample`` MiB of
them) is coded by both paths, every blob's header is read back, and the stored bytes are
summed:

* by chunk size (tiny tensors, small ones, whole 4 MiB chunks);
* by plane (layout and plane index), with the plane codecs each path chose;
* headers, and the bytes zero blocks left out.

Each row's gap is in points of the sample's raw bytes, so the rows add up to the whole
gap that ``bench/codec_gpu.py`` prints.

    python bench/codec_gpu_planes.py [--sets adam] [--sample 256]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

MiB = 1 << 20


def _bucket(n: int) -> str:
    if n <= 4096:
        return "<= 4 KiB"
    if n <= 256 << 10:
        return "<= 256 KiB"
    if n < 4 << 20:
        return "< 4 MiB"
    return "4 MiB"


def _tally(blob, raw_len, by_size, by_plane, head):
    from s4fs.codec import _container
    from s4fs.codec._plane_codecs import NAMES
    h = _container.unpack(blob)
    size = _bucket(raw_len)
    by_size[size][0] += 1
    by_size[size][1] += raw_len
    by_size[size][2] += len(blob)
    head["header"] += h.payload_offset
    if h.block:
        head["zero-block chunks"] += 1
        head["zero bytes left out"] += h.raw_len - h.kept_len
    for k, p in enumerate(h.planes):
        row = by_plane[(h.layout, k)]
        row["raw"] += p.raw_len
        row["enc"] += p.enc_len
        row["codecs"][NAMES.get(p.codec_id, str(p.codec_id))] += p.enc_len


def _new_plane():
    return {"raw": 0, "enc": 0, "codecs": collections.Counter()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="adam")
    p.add_argument("--size", type=float, default=1.0)
    p.add_argument("--sample", type=float, default=0,
                   help="MiB of chunks compared (0: the whole set)")
    p.add_argument("--weights", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import codec_gpu as B
    from s4fs.codec import gpu
    gpu.require()
    data, source, sizes = B.device_sets(args.sets, args.size, args.weights)
    what = f"the first {args.sample:g} MiB of chunks" if args.sample else "every chunk"
    print(f"# {source}; {what}, cut per tensor")
    for name, (dtype, flat) in data.items():
        every = B._chunks(flat, 4 << 20, sizes)
        host, cblobs, _ = B.cpu_sample([(c, dtype) for c in every],
                                       args.sample * MiB if args.sample else float("inf"))
        chunks = every[: len(host)]
        # the GPU codes the whole set in one call, as bench/codec_gpu.py does; the sample's
        # blobs are taken from that call (and, to see whether a batch changes them, from a
        # call over the sample alone)
        whole = gpu.compress_many([(c, dtype) for c in every], out="host")
        gblobs = whole[: len(chunks)]
        alone = gpu.compress_many([(c, dtype) for c in chunks], out="host")
        raw = sum(len(h) for h in host)
        differ = [k for k, (x, y) in enumerate(zip(gblobs, alone)) if len(x) != len(y)]
        print(f"\n{name}: the whole set ({len(every)} chunks) in one GPU call stores "
              f"{100 * sum(len(x) for x in whole) / (flat.numel() * flat.element_size()):.2f} %; "
              f"of the sample's {len(chunks)} blobs, {len(differ)} differ in size from a call "
              f"over the sample alone ({sum(len(x) for x in gblobs) * 100 / raw:.2f} % "
              f"against {sum(len(x) for x in alone) * 100 / raw:.2f} %)")
        gaps = sorted(((len(x) - len(y), k) for k, (x, y) in enumerate(zip(gblobs, cblobs))),
                      reverse=True)[:8]
        print("largest GPU - CPU differences (bytes, chunk, raw bytes): " + ", ".join(
            f"{d:+d} #{k} {len(host[k])}" for d, k in gaps))
        res = {}
        for who, blobs in (("gpu", gblobs), ("cpu", cblobs)):
            by_size = collections.defaultdict(lambda: [0, 0, 0])
            by_plane = collections.defaultdict(_new_plane)
            head = collections.Counter()
            for blob, h in zip(blobs, host):
                _tally(blob, len(h), by_size, by_plane, head)
            res[who] = (by_size, by_plane, head, sum(len(b) for b in blobs))
        g, c = res["gpu"], res["cpu"]
        pts = 100.0 / raw
        print(f"\n## {name}: {len(chunks)} chunks, {raw / MiB:.0f} MiB; stored GPU "
              f"{g[3] * pts:.2f} %, CPU {c[3] * pts:.2f} % (gap {(g[3] - c[3]) * pts:+.2f})")
        print("\n| chunk size | chunks | raw MiB | GPU % of raw | CPU % | gap (points of the sample) |")
        print("|---|---:|---:|---:|---:|---:|")
        for key in ("<= 4 KiB", "<= 256 KiB", "< 4 MiB", "4 MiB"):
            n, r, gs = g[0].get(key, (0, 0, 0))
            cs = c[0].get(key, (0, 0, 0))[2]
            if n:
                print(f"| {key} | {n} | {r / MiB:.1f} | {100 * gs / r:.2f} | {100 * cs / r:.2f} "
                      f"| {(gs - cs) * pts:+.3f} |")
        print("\n| path | layout, plane | raw MiB | stored MiB | % of plane | points of the "
              "sample | codecs (stored MiB) |")
        print("|---|---|---:|---:|---:|---:|---|")
        for who, (_, by_plane, _, _) in (("GPU", g), ("CPU", c)):
            for (lay, k), row in sorted(by_plane.items()):
                mix = ", ".join(f"{n} {v / MiB:.1f}" for n, v in row["codecs"].most_common())
                print(f"| {who} | {lay}, {k} | {row['raw'] / MiB:.1f} | {row['enc'] / MiB:.2f} "
                      f"| {100 * row['enc'] / max(row['raw'], 1):.2f} | {row['enc'] * pts:.3f} "
                      f"| {mix} |")
        for who, (_, _, head, _) in (("GPU", g), ("CPU", c)):
            print(f"{who}: headers {head['header'] / MiB:.2f} MiB ({head['header'] * pts:.3f} "
                  f"points); {head['zero-block chunks']} chunks with zero blocks, "
                  f"{head['zero bytes left out'] / MiB:.1f} MiB left out")


if __name__ == "__main__":
    main()

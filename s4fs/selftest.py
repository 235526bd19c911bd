"""``s4fs selftest [--device cuda|cpu|auto]``: compress and restore every adversarial data
set (``s4fs.testing.adversarial``) on the chosen device, and across devices where the
formats allow, print a table, and exit non-zero unless every result is bit-exact.

Paths checked (a dash where the device does not apply):

* ``cpu``           CPU encode → CPU decode
* ``gpu``           GPU encode → GPU decode, one chunk at a time (``s4fs.codec`` API)
* ``gpu-batch``     every set in one ``compress_many`` → one ``decompress_many``
* ``cpu→gpu``       CPU encode → GPU decode
* ``portable→cpu``  GPU encode with the portable profile → CPU decode

This is the image build gate of the deployment: it must pass on the GPU image.
"""

from __future__ import annotations

import argparse
import sys
import time

from s4fs.errors import S4Error


def _cases(n_random: int):
    from s4fs.testing import adversarial as A
    rows = [(name, dt, data, None) for name, dt, data in A.all_cases(n_random=n_random)]
    return rows + list(A.delta_cases())


def _check(fn, data: bytes) -> tuple[bool, str]:
    try:
        blob, out = fn()
    except S4Error as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if bytes(out) != data:
        return False, "bytes differ"
    if not data:
        return True, f"{len(blob)} B"
    return True, f"{100 * len(blob) / len(data):.1f}%"


def run(device: str, n_random: int = 1_000_000, out=sys.stdout) -> int:
    from s4fs.codec import compress, decompress, lookup, resolve_device

    try:
        device = resolve_device(device)
    except S4Error as exc:
        print(f"selftest: {exc}", file=out)
        return 2
    cases = _cases(n_random)
    paths = ["cpu"] + (["gpu", "gpu-batch", "cpu→gpu", "portable→cpu"] if device == "cuda" else [])
    results: dict[str, list[tuple[bool, str]]] = {p: [] for p in paths}
    started = time.perf_counter()

    for name, dt, data, base in cases:
        results["cpu"].append(_check(lambda: _rt(compress(data, dt, base=base, device="cpu"),
                                                 base, "cpu", decompress), data))
    if device == "cuda":
        from s4fs.codec import gpu
        for name, dt, data, base in cases:
            results["gpu"].append(_check(lambda: _rt(compress(data, dt, base=base, device="cuda"),
                                                     base, "cuda", decompress), data))
            results["cpu→gpu"].append(_check(lambda: _rt(compress(data, dt, base=base, device="cpu"),
                                                         base, "cuda", decompress), data))
            results["portable→cpu"].append(_check(lambda: _rt(
                gpu.compress(data, lookup(dt), base=base, profile=gpu.PORTABLE),
                base, "cpu", decompress), data))
        try:
            blobs = gpu.compress_many([(d, t, b) for _, t, d, b in cases])
            outs = gpu.decompress_many(blobs, [b for *_, b in cases])
            for (_, _, data, _), blob, res in zip(cases, blobs, outs):
                results["gpu-batch"].append(_check(lambda: (blob, res), data))
        except S4Error as exc:
            results["gpu-batch"] = [(False, f"{type(exc).__name__}: {exc}")] * len(cases)

    _table(cases, paths, results, out)
    ok = all(r[0] for rs in results.values() for r in rs)
    total = sum(len(rs) for rs in results.values())
    bad = sum(not r[0] for rs in results.values() for r in rs)
    print(f"\n{total - bad}/{total} round trips bit-exact on device={device} "
          f"in {time.perf_counter() - started:.1f} s: {'PASS' if ok else 'FAIL'}", file=out)
    return 0 if ok else 1


def _rt(blob, base, device, decompress):
    return blob, decompress(blob, base=base, device=device)


def _table(cases, paths, results, out) -> None:
    head = ["data set", "dtype", "bytes"] + paths
    rows = []
    for i, (name, dt, data, base) in enumerate(cases):
        label = name + (" (delta)" if base is not None else "")
        cells = []
        for p in paths:
            ok, note = results[p][i]
            cells.append(("ok " + note) if ok else ("FAIL " + note[:60]))
        rows.append([label, dt, str(len(data))] + cells)
    widths = [max(len(r[k]) for r in rows + [head]) for k in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(head), file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for r in rows:
        print(line(r), file=out)
    for p in paths:
        for i, (ok, note) in enumerate(results[p]):
            if not ok:
                print(f"FAIL {p} {cases[i][0]}: {note}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="s4fs selftest",
        description="bit-exact compress/restore of every adversarial data set; "
                    "exits 1 unless all pass, 2 when the device is unavailable")
    from s4fs.codec import DEVICES
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--random-size", type=int, default=1_000_000,
                        help="elements in the random data sets (default 1000000)")
    args = parser.parse_args(argv)
    return run(args.device, args.random_size)


if __name__ == "__main__":
    sys.exit(main())

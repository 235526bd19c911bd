"""The ``s4fs`` command line. It builds a config and calls the Python API / core.

    s4fs mount STORE MOUNTPOINT [--foreground] [--allow-other] [--cache-dir D]
    s4fs umount MOUNTPOINT
    s4fs ls PATH            s4fs stat PATH [--json]      s4fs verify PATH...
    s4fs gc STORE [--dry-run] [--grace SECONDS]          s4fs export PATH DEST
    s4fs init DIR           s4fs selftest [--device D]   s4fs runner [--config F]

PATH is a file or folder in a store (a path under a local store root, ``file://`` or
``s3://`` URL) or under a mounted s4fs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys

# subcommand -> module whose main(argv) -> int handles it
_DELEGATED = {
    "selftest": "s4fs.selftest",
    "runner": "s4fs.service.runner",
}


def _fs_config(args):
    from s4fs.fs import FsConfig
    from s4fs.fsconfig import cold_reads_here
    from s4fs.coding import IngestConfig
    size = getattr(args, "cache_size", None)
    workers = getattr(args, "workers", None)
    # a mount codes in worker processes (s4fs.coding); --workers 0 codes in the
    # daemon's own threads instead
    ingest = IngestConfig(device=getattr(args, "device", None) or "cpu",
                          processes=workers != 0)
    if workers:
        ingest = dataclasses.replace(ingest, workers=workers)
    chain = getattr(args, "max_chain_read", None)
    if chain is not None:
        ingest = dataclasses.replace(ingest, max_chain_read=chain)
    return FsConfig(ingest=ingest,
                    delta=not getattr(args, "no_delta", False),
                    delta_direction="forward" if getattr(args, "forward_deltas", False)
                    else "backward",
                    cache_dir=getattr(args, "cache_dir", None),
                    writeback=bool(getattr(args, "writeback", False)),
                    code_while_written=bool(getattr(args, "code_while_written", False)),
                    cold_reads=getattr(args, "cold_reads", None) or cold_reads_here(),
                    decoded_cache_bytes=None if size is None else _parse_size(size))


def _parse_size(text: str) -> int:
    """``"20G"``, ``"512M"``, ``"0"`` (off), plain bytes."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        return int(float(t) * mult)
    except ValueError:
        from s4fs.errors import InvalidArgument
        raise InvalidArgument(f"not a size: {text!r} (use e.g. 20G, 512M, 0)") from None


def cmd_mount(args) -> int:
    mountpoint = os.path.abspath(args.mountpoint)
    if args.passthrough == "on":
        from s4fs.mount import require_passthrough
        require_passthrough()
    if not args.foreground:
        from s4fs.mount import run_daemon
        from s4fs.options import daemon_flags
        argv = ["mount", args.store, mountpoint, *daemon_flags(args)]
        log_file = args.log_file or (os.path.join(args.cache_dir, "s4fs-mount.log")
                                     if args.cache_dir else None)
        if args.cache_dir:
            os.makedirs(args.cache_dir, exist_ok=True)
        return run_daemon(argv, mountpoint, log_file=log_file)
    from s4fs.fs import Filesystem
    from s4fs.mount import mount_foreground
    from s4fs.stores import open_store
    if args.cache_dir:
        os.makedirs(args.cache_dir, exist_ok=True)
    from s4fs.mount import prepare_mountpoint
    prepare_mountpoint(mountpoint)      # refuse a live mount before opening the store
    # the daemon's worker processes and threads: started through the mount, closed last
    from s4fs.runtime import Runtime
    runtime = Runtime()
    fs = Filesystem(open_store(args.store), _fs_config(args), runtime=runtime)
    if args.gc_interval > 0:
        from s4fs.gc import BackgroundCollector
        BackgroundCollector(fs.store, interval=args.gc_interval).start()
    from s4fs.control import ControlServer
    info: dict = {}                     # the mount keeps it current, status reports it
    control = ControlServer(fs, mountpoint, info)
    try:
        mount_foreground(fs, mountpoint, allow_other=args.allow_other,
                         ready_fd=args.ready_fd, uid=args.uid, gid=args.gid,
                         source=_source_url(args.store), passthrough=args.passthrough,
                         info=info)
    finally:
        control.close()
        runtime.close()
    return 0


def cmd_sync(args) -> int:
    """Wait until every file the mount accepted is committed; fail naming any that
    could not be."""
    from s4fs.control import request
    stop = _sync_progress(args)
    try:
        answer = request(args.mountpoint, "sync", timeout=args.timeout)
    finally:
        stop()
    failed = answer.get("failed", [])
    for f in failed:
        print(f"s4fs sync: {f['path']} ({f['bytes']} bytes) is not committed: {f['error']} "
              f"(tried {f['attempts']} times; its bytes are kept and retried)",
              file=sys.stderr)
    return 1 if failed else 0


def _sync_progress(args):
    """While `s4fs sync` waits: a bar of the pending bytes going down (a TTY only)."""
    import threading
    bar_cls = _progress(args)
    if bar_cls is None:
        return lambda: None
    from s4fs.control import request
    done = threading.Event()

    def watch():
        bar = None
        total = 0
        while not done.wait(0.5):
            try:
                pending = request(args.mountpoint, "status", wait=5).get("pending", [])
            except Exception:                     # noqa: BLE001 - only a progress bar
                return
            left = sum(p["bytes"] for p in pending)
            if bar is None:
                if not left:
                    continue
                total = left
                bar = bar_cls(total=total, desc="sync", unit="B", unit_scale=True,
                              unit_divisor=1024, leave=False)
            bar.n = max(0, total - left)
            bar.refresh()
        if bar is not None:
            bar.close()
    t = threading.Thread(target=watch, daemon=True)
    t.start()

    def stop():
        done.set()
        t.join(2)
    return stop


def cmd_report(args) -> int:
    """What a run's checkpoints cost: a table (or --json), an HTML page, PNGs."""
    from s4fs.api import resolve
    from s4fs.report import render_html, render_png, run_report
    fs, rel = resolve(args.path)
    rep = run_report(fs, rel, top=args.top, progress=_progress(args))
    if not rep["checkpoints"]:
        print(f"s4fs report: no files under {args.path}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print(f"{rep['store']} {rep['root']}: {len(rep['checkpoints'])} checkpoints, "
              f"{_human(rep['logical'])} logical, {_human(rep['stored'])} stored "
              f"({100 * rep['saving']:.1f}% saved)")
        print(f"  {'checkpoint':<48} {'logical':>10} {'stored':>10} {'%':>6} "
              f"{'deltas':>7} {'depth':>5}")
        for c in rep["checkpoints"]:
            pct = 100 * c["stored"] / c["logical"] if c["logical"] else 0
            dl = 100 * c["stored_delta"] / c["stored"] if c["stored"] else 0
            print(f"  {c['name'][-48:]:<48} {_human(c['logical']):>10} "
                  f"{_human(c['stored']):>10} {pct:>5.1f}% {dl:>6.0f}% "
                  f"{c['chain_depth']:>5}")
    try:
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(render_html(rep))
            print(f"wrote {args.out}", file=sys.stderr)
        if args.png:
            for path in render_png(rep, args.png):
                print(f"wrote {path}", file=sys.stderr)
    except ImportError:
        print("s4fs report: drawing needs matplotlib: pip install 's4fs[report]'",
              file=sys.stderr)
        return 2
    return 0


def cmd_status(args) -> int:
    from s4fs.control import request
    answer = request(args.mountpoint, "status", wait=30)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    pending = answer.get("pending", [])
    mode = "writeback" if answer.get("writeback") else "commit on close"
    print(f"{answer['mountpoint']}: {answer['store']} ({mode}); {len(pending)} files "
          f"pending, {_human(sum(p['bytes'] for p in pending))}")
    if answer.get("transport"):
        print(f"  through {answer['transport']}")
    for p in pending:
        state = f"failing ({p['attempts']} tries): {p['error']}" if p["attempts"] else \
            "committing"
        print(f"  {p['path']}  {_human(p['bytes'])}  {state}")
    return 0


def _source_url(store: str) -> str:
    """The store as the mount table shows it: the URL given (with its options), or an
    absolute path for a local store."""
    if "://" in store:
        return store
    return os.path.abspath(store)


def cmd_umount(args) -> int:
    from s4fs.mount import unmount
    unmount(os.path.abspath(args.mountpoint), lazy=args.lazy)
    return 0


def cmd_build_passthrough(args) -> int:
    from s4fs.mount import build_passthrough
    wheel = build_passthrough(args.dest, python=args.python or sys.executable,
                              install=not args.no_install)
    if args.no_install:
        print(wheel)
    return 0


def cmd_init(args) -> int:
    from s4fs.api import filesystem
    filesystem(args.store)
    print(f"s4fs store ready at {args.store}")
    return 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_ls(args) -> int:
    from s4fs.api import resolve
    fs, rel = resolve(args.path)
    a = fs.stat(rel)
    entries = [a] if not a.is_dir else [fs.stat(f"{rel}/{n}" if rel else n)
                                         for n in fs.listdir(rel)]
    for e in entries:
        if e.is_dir:
            print(f"{'dir':>10} {'':>10} {'':>7}  {e.name}/")
        elif e.is_link:
            print(f"{'link':>10} {'':>10} {'':>7}  {e.name} -> {os.fsdecode(e.target)}")
        else:
            ratio = f"{100 * e.stored / e.size:.1f}%" if e.size else "-"
            print(f"{_human(e.size):>10} {_human(e.stored):>10} {ratio:>7}  {e.name}")
    return 0


def _progress(args):
    """A tqdm progress-bar factory for a long command, or None: none when stderr is not
    a terminal, with --quiet, or without tqdm installed."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _bytes_bar(args, total: int, desc: str):
    bar = _progress(args)
    if bar is None:
        return None
    return bar(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
               leave=False)


def cmd_stat(args) -> int:
    from s4fs.api import resolve
    from s4fs.errors import NotFound
    from s4fs.report import file_report
    fs, rel = resolve(args.path)
    try:
        r = file_report(fs, rel)
    except NotFound:
        _not_committed_yet(args.path)
        raise
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['path']}: {r['kind']}, {r['logical']} bytes logical, {r['stored']} stored "
          f"({100 * r['ratio']:.1f}%)")
    how = {"backward": f"as deltas on the newer {r['newer']} (backward)",
           "forward": f"as deltas on {r['base']} (forward)",
           "whole": "whole"}[r["direction"]]
    print(f"  stored {how}, read through at most {r['chain_depth']} deltas")
    print(f"  delta base: {r['base'] or '-'}   chain depth: {r['chain_depth']}   "
          f"stored as delta: {r['stored_delta']}   full: {r['stored_full']}   "
          f"unchanged (reused): {r['unchanged_bytes']}")
    print(f"  a node with nothing cached fetches {r['read_cold']} bytes to read it "
          f"({100 * r['read_cold'] / r['logical'] if r['logical'] else 0:.1f}% of logical; "
          f"delta chains included)")
    if r["tensors"]:
        print(f"  {'tensor':<60} {'dtype':<14} {'logical':>12} {'stored':>12} {'%':>6}")
        for t in r["tensors"]:
            pct = 100 * t["stored"] / t["logical"] if t["logical"] else 0
            print(f"  {t['name'][:60]:<60} {t['dtype']:<14} {t['logical']:>12} "
                  f"{t['stored']:>12} {pct:>6.1f}"
                  + (f"  coded on its {'copy' if t['dtype'] == 'float32' else 'master'} "
                     f"{t['paired_on']}" if t.get("paired_on") else ""))
    return 0


def _not_committed_yet(path) -> None:
    """A file a writeback mount accepted but has not committed is not in the store yet:
    say so (and how to wait for it) instead of "no such file"."""
    from s4fs.api import mount_of
    from s4fs.control import request
    from s4fs.errors import NotFound
    found = mount_of(path)
    if found is None:
        return
    _, point, rel = found
    try:
        pending = request(point, "status", wait=10).get("pending", [])
    except Exception:                              # noqa: BLE001 - only a better message
        return
    for p in pending:
        if p["path"] == rel:
            state = f"its commit failed {p['attempts']} times: {p['error']}" \
                if p["attempts"] else "its commit is running"
            raise NotFound(f"{path} is accepted by the writeback mount at {point} but not "
                           f"in the store yet ({state}); `s4fs sync {point}` waits for it")


def cmd_verify(args) -> int:
    import xxhash
    from s4fs.api import resolve
    bad = 0
    from s4fs.report import walk
    for p in args.paths:
        fs, rel = resolve(p)
        targets = walk(fs, rel)
        bar = _bytes_bar(args, sum(fs.stat(t).size for t in targets), "verify")
        for t in targets:
            try:
                m = fs.manifest(t, fresh=True)
                h = xxhash.xxh3_128()
                r = fs.open_read(t)
                pos = 0
                while pos < m.size:
                    data = r.read(pos, 16 << 20)
                    if not data:
                        raise OSError(f"{t} ends at {pos} of {m.size} bytes")
                    h.update(data)
                    pos += len(data)
                    if bar is not None:
                        bar.update(len(data))
                ok = h.hexdigest() == m.xxh128
            except Exception as exc:  # report every file, then fail
                ok = False
                print(f"FAIL {t}: {exc}")
            else:
                print(f"{'ok  ' if ok else 'FAIL'} {t}")
            bad += not ok
        if bar is not None:
            bar.close()
    return 1 if bad else 0


def cmd_export(args) -> int:
    import shutil
    from s4fs.api import open as s4open
    with s4open(args.path) as src, open(args.dest, "wb") as dst:
        bar = _bytes_bar(args, src.seek(0, 2), "export")
        src.seek(0)
        if bar is None:
            shutil.copyfileobj(src, dst, 16 << 20)
            return 0
        with bar:
            while True:
                data = src.read(16 << 20)
                if not data:
                    break
                dst.write(data)
                bar.update(len(data))
    return 0


def cmd_gc(args) -> int:
    from s4fs.api import filesystem
    from s4fs.gc import collect
    fs = filesystem(args.store)
    report = collect(fs.store, grace=args.grace, dry_run=args.dry_run,
                     progress=_progress(args))
    verb = "would free" if args.dry_run else "freed"
    for key, size in report.freed:
        print(f"{verb} {key} ({size} bytes)")
    print(f"{verb} {len(report.freed)} packs, {report.freed_bytes} bytes; kept "
          f"{report.kept} packs referenced by {report.manifests} files; "
          f"{report.young} unreferenced packs younger than the grace period")
    return 0


# long on purpose: the declaration of every subcommand, one block each, in the order
# --help lists them (the mount's own options are declared in s4fs/options.py)
def build_parser() -> argparse.ArgumentParser:
    from s4fs.options import add_arguments
    p = argparse.ArgumentParser(prog="s4fs", description="lossless checkpoint filesystem")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mount", help="mount a store")
    m.add_argument("store")
    m.add_argument("mountpoint")
    add_arguments(m)                    # s4fs/options.py declares them
    m.set_defaults(fn=cmd_mount)
    u = sub.add_parser("umount", help="unmount")
    u.add_argument("mountpoint")
    u.add_argument("--lazy", "-z", action="store_true")
    u.set_defaults(fn=cmd_umount)
    i = sub.add_parser("init", help="create a store")
    i.add_argument("store")
    i.set_defaults(fn=cmd_init)
    ls = sub.add_parser("ls", help="list files with logical and stored sizes")
    ls.add_argument("path")
    ls.set_defaults(fn=cmd_ls)
    s = sub.add_parser("stat", help="sizes, ratio, delta chain and tensors of a file")
    s.add_argument("path")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_stat)
    v = sub.add_parser("verify", help="re-read files and check their whole-file hash")
    v.add_argument("paths", nargs="+")
    v.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    v.set_defaults(fn=cmd_verify)
    e = sub.add_parser("export", help="copy a stored file out, byte-exact")
    e.add_argument("path")
    e.add_argument("dest")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    e.set_defaults(fn=cmd_export)
    r = sub.add_parser("report", help="what a folder of checkpoints costs: a table, "
                                      "--json, an HTML page (--out), PNGs (--png)")
    r.add_argument("path")
    r.add_argument("--out", help="write a self-contained HTML report here")
    r.add_argument("--png", help="write the plots as PNG files into this folder")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.add_argument("--top", type=int, default=12,
                   help="largest tensors to break down by byte plane (default 12)")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.set_defaults(fn=cmd_report)
    sy = sub.add_parser("sync", help="wait until a mount has committed every file (and "
                                     "stored the versions before them as deltas on them)")
    sy.add_argument("mountpoint")
    sy.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sy.add_argument("--timeout", type=float,
                    help="give up after this many seconds (default: until each pending "
                         "file is committed or has failed once)")
    sy.set_defaults(fn=cmd_sync)
    st_ = sub.add_parser("status", help="what a mount has pending")
    st_.add_argument("mountpoint")
    st_.add_argument("--json", action="store_true")
    st_.set_defaults(fn=cmd_status)
    what = ("build pyfuse3 with FUSE passthrough (a patched pyfuse3 3.5.0, against the "
            "system's libfuse where it is >= 3.17.3, else against libfuse 3.18.3 built "
            "from Debian's source and bundled into the wheel) and install it for this "
            "Python, so mounts take the fast path where the kernel has it; needs curl, "
            "patch, a C compiler, pkg-config, Python's headers and the network "
            "(docs/OPERATING.md)")
    bp = sub.add_parser("build-passthrough", help=what, description=what)
    bp.add_argument("--dest", help="where the build goes: DEST/wheel installs on other "
                                   "machines of this kind with pip install --no-index "
                                   "--no-deps (default: PREFIX/share/s4fs/"
                                   "pyfuse3-passthrough of the Python it is for)")
    bp.add_argument("--python", help="the Python to build and install it for (default: "
                                     "the one running this command)")
    bp.add_argument("--no-install", action="store_true",
                    help="build (or reuse) the wheel only, install nothing, and print "
                         "its path")
    bp.set_defaults(fn=cmd_build_passthrough)
    g = sub.add_parser("gc", help="free packs no file references")
    g.add_argument("store")
    g.add_argument("--dry-run", action="store_true")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    g.add_argument("--grace", type=float, default=6 * 3600,
                   help="keep unreferenced packs younger than this many seconds")
    g.set_defaults(fn=cmd_gc)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        mod = importlib.import_module(_DELEGATED[argv[0]])
        return int(mod.main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s.%(msecs)03d s4fs: %(levelname)s %(name)s: "
                               "%(message)s", datefmt="%H:%M:%S")
    from s4fs.errors import S4Error
    try:
        return int(args.fn(args) or 0)
    except S4Error as exc:
        print(f"s4fs: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"s4fs: {exc}", file=sys.stderr)
        return 1


def mount_helper(argv: list[str] | None = None) -> int:
    """``mount.fuse.s4fs STORE MOUNTPOINT [-o opts]`` — used by ``mount -t fuse.s4fs``
    and /etc/fstab. The -o names are declared in s4fs/options.py (``python -m
    s4fs.options --markdown`` lists them); generic mount options (rw, noauto, _netdev,
    x-systemd.*, ...) are ignored."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        print("usage: mount.fuse.s4fs STORE MOUNTPOINT [-o OPTIONS]", file=sys.stderr)
        return 2
    store, mountpoint, rest = argv[0], argv[1], argv[2:]
    opts: list[str] = []
    while rest:
        a = rest.pop(0)
        if a == "-o" and rest:
            opts += rest.pop(0).split(",")
        elif a.startswith("-o"):
            opts += a[2:].split(",")
    from s4fs.options import flags_from_o
    flags = flags_from_o(opts, lambda why: print(f"mount.fuse.s4fs: {why}", file=sys.stderr))
    return main(["mount", store, mountpoint, *flags])


if __name__ == "__main__":
    sys.exit(main())

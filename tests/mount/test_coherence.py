"""Coherence of the mount with a local disk while files change under open descriptors
(issue 28).

Local-disk semantics are the reference (docs/SEMANTICS.md):

* a descriptor reads the file it opened: an in-place change (``O_TRUNC``, truncate,
  append) is seen through descriptors opened before it, never a mixture of two versions;
* ``rename`` over a path or ``unlink`` leaves a descriptor opened before on the old file,
  whole, also across ``s4fs gc --grace 0``;
* after a writer's ``close()`` a fresh open reads exactly the new version, whatever other
  descriptors read meanwhile (both commit modes);
* another mount of the same store reads the old or the new version whole, and the new
  one after the metadata lifetime.

Every check here reads with one ``pread`` per read, so "a slice of one version" means the
bytes one system call returned.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from mount_helpers import TRANSPORT, s3_url

pytestmark = pytest.mark.fuse

MiB = 1 << 20
PIECE = 100003              # unaligned writes: what torch.save's writev of header+storage does
MODES = {"default": (), "writeback": ("--writeback",)}
METADATA_LIFETIME = 3.0     # 1 s metadata TTL + 1 s kernel attribute cache, with margin


# --------------------------------------------------------------------------- helpers

def random_bytes(seed, n: int) -> bytes:
    return random.Random(str(seed)).randbytes(n)


def write_in_pieces(path, data: bytes, *, mode: str = "wb", piece: int = PIECE) -> None:
    with open(path, mode, buffering=0) as f:
        for i in range(0, len(data), piece):
            f.write(data[i:i + piece])


def read_fresh(path) -> bytes:
    """A fresh open, read whole with one pread (one system call, one version)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, os.fstat(fd).st_size + MiB, 0)
    finally:
        os.close(fd)


def is_slice(got: bytes, off: int, versions) -> bool:
    """``got`` is what one read at ``off`` may return from one of ``versions``."""
    return any(v[off:off + len(got)] == got for v in versions)


def is_switch(got: bytes, off: int, versions) -> bool:
    """``got`` is one of ``versions`` (in the order they were committed) up to some byte
    and the next one after it: what a single read that races the moment a mount switches
    to a version committed elsewhere may return (as a read racing an overwrite on a local
    disk may)."""
    for old, new in zip(versions, versions[1:]):
        n = first_difference(got, old[off:off + len(got)])
        if got[n:] == new[off + n:off + len(got)]:
            return True
    return False


def is_mixture(got: bytes, off: int, versions) -> bool:
    """Every byte of ``got`` is the byte at its offset of one of two consecutive
    ``versions`` (its size one of theirs): what a read returns that races a file being
    rewritten in place from the one to the other — through FUSE passthrough the kernel
    reads the one local file every descriptor of the inode shares, which a switch to
    another mount's version rewrites (docs/SEMANTICS.md); the page a read copies while
    the rewrite copies into it may be part old, part new, as on a local disk."""
    g = np.frombuffer(got, np.uint8)
    for old, new in zip(versions, versions[1:]):
        a = np.frombuffer(old[off:off + len(got)], np.uint8)
        b = np.frombuffer(new[off:off + len(got)], np.uint8)
        n = min(len(a), len(b))
        longer = a if len(a) > len(b) else b
        if len(longer) >= len(g) and np.all((g[:n] == a[:n]) | (g[:n] == b[:n])) and \
                np.array_equal(g[n:], longer[n:]):
            return True
    return False


def is_torn(got: bytes, off: int, versions) -> bool:
    """``got`` is one version up to some byte and another one (in either order), or
    zeros, after it: what a single read may return on a local disk when it races a writer
    that truncates the file and writes it anew (the read takes pages before the truncate
    and copies them after the writer has grown the file again, or the other way round,
    or copies pages the truncate is zeroing)."""
    head = max((first_difference(got, v[off:off + len(got)]) for v in versions), default=0)
    for w in versions:
        want = w[off:off + len(got)]
        if len(want) == len(got) and \
                len(got) - first_difference(got[::-1], want[::-1]) <= head:
            return True
    # or zeros after it: the read met a truncate that shrank the file, whose pages were
    # zeroed as it copied them (a local disk does this too)
    if not got[head:].strip(b"\0"):
        return True
    return is_zeroed_past_a_truncate(got, off, versions)


def is_zeroed_past_a_truncate(got: bytes, off: int, versions) -> bool:
    """``got`` is one version with some of its bytes past a truncate point read as zeros:
    a kernel with large page-cache folios (ext4 from Linux 6.16) zeroes the part of the
    folio that straddles the new size in place, while a reader that took that folio
    before the truncate copies it; the reader then sees the old bytes with zeroed
    stretches (several, cache line by cache line, when the writer writes them back).
    The truncate point is the end of a known version that is a prefix of the old one."""
    g = np.frombuffer(got, np.uint8)
    for w in versions:
        want = w[off:off + len(got)]
        if len(want) != len(got) or not len(got):
            continue
        cuts = [len(v) for v in versions if len(v) < len(w) and w[:len(v)] == v]
        if not cuts:
            continue
        changed = np.flatnonzero(g != np.frombuffer(want, np.uint8))
        if not (g[changed] == 0).all():
            continue                     # a byte of neither this version nor a zero
        if not len(changed) or off + int(changed[0]) >= min(cuts):
            return True
    return False


def first_difference(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    step = 1 << 16
    for i in range(0, n, step):
        end = min(i + step, n)
        if a[i:end] != b[i:end]:
            return next(j for j in range(i, end) if a[j] != b[j])
    return n


def explain(got: bytes, off: int, versions: dict) -> str:
    """Where a read parts from each version it might have been a slice of."""
    parts = []
    for name, v in versions.items():
        want = v[off:off + len(got)]
        if want == got:
            parts.append(f"equals {name}" if off + len(got) == len(v) else
                         f"equals {name}'s bytes {off}..{off + len(got)} of {len(v)}")
        elif len(want) < len(got) and got[:len(want)] == want:
            parts.append(f"runs {len(got) - len(want)} bytes past the end of {name} "
                         f"({len(v)} bytes)")
        else:
            parts.append(f"differs from {name} at byte {off + first_difference(got, want)}")
    return f"{len(got)} bytes at offset {off}: " + "; ".join(parts)


def explain_nearest(got: bytes, off: int, versions: list) -> str:
    """Like explain, for the two versions a read agrees with longest, and whether the
    rest of it then agrees with another version (a mixture)."""
    agree = sorted(((first_difference(got, v[off:off + len(got)]), k)
                    for k, v in enumerate(versions)), reverse=True)[:2]
    text = explain(got, off, {f"version {k}": versions[k] for _, k in agree})
    n, k = agree[0] if agree else (0, None)
    rest = [j for j, v in enumerate(versions)
            if j != k and n < len(got) and v[off + n:off + len(got)] == got[n:]]
    if rest:
        text += f"; from byte {off + n} on it is version {rest[0]}"
    return text + f" (of {len(versions)} versions)"


def page_map(got: bytes, off: int, versions: dict, page: int = 4096) -> str:
    """Which version (or zeros) each 4 KiB page of ``got`` holds at its offset, as runs:
    "pages 0-465 old, 465-977 zeros" — what a failure message needs to tell a stale page
    from a torn write or a wrong file."""
    runs: list[list] = []
    for k in range(0, len(got), page):
        piece = got[k:k + page]
        who = next((n for n, v in versions.items() if v[off + k:off + k + len(piece)] == piece),
                   "zeros" if not piece.strip(b"\0") else "neither")
        if runs and runs[-1][2] == who:
            runs[-1][1] = k // page + 1
        else:
            runs.append([k // page, k // page + 1, who])
    return "pages " + ", ".join(f"{a}-{b} {w}" for a, b, w in runs)


class PreadLoop(threading.Thread):
    """Keeps reading ``fd`` (one pread of ``size`` bytes at ``off`` per read) and checks
    that every read is a slice of one of ``versions`` (a dict it rereads every time; None:
    only that reads do not fail)."""

    def __init__(self, fd: int, versions: dict, size: int, off: int = 0,
                 switch_ok: bool = False):
        super().__init__(daemon=True)
        self.fd, self.versions, self.size, self.off = fd, versions, size, off
        self.switch_ok = switch_ok       # one switch to the next version within a read
        self.history: dict = {}          # earlier versions, named in failure messages
        self.halt = threading.Event()
        self.reads = 0
        self.bad = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                got = os.pread(self.fd, self.size, self.off)
            except OSError as exc:
                self.bad += 1
                if len(self.failures) < 3:
                    self.failures.append(f"pread raised {exc!r}")
                time.sleep(0.01)
                continue
            self.reads += 1
            versions = list(self.versions.values()) if self.versions is not None else None
            if versions is not None and not is_slice(got, self.off, versions) and \
                    not (self.switch_ok and (is_switch(got, self.off, versions) or (
                        TRANSPORT == "passthrough" and is_mixture(got, self.off,
                                                                  versions)))):
                self.bad += 1
                if len(self.failures) < 3:
                    seen = {**self.history, **self.versions}
                    self.failures.append(explain(got, self.off, dict(self.versions)) + "; "
                                         + page_map(got, self.off, seen))

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        assert not self.is_alive(), "the reading thread hangs in pread"

    def report(self, what: str) -> list[str]:
        if not self.bad:
            return []
        return [f"{what}: {self.bad} of {self.reads + self.bad} reads failed or were not a "
                f"slice of one version, e.g."] + [f"    {f}" for f in self.failures]


def gc_now(store: str) -> str:
    res = subprocess.run([sys.executable, "-m", "s4fs.cli", "gc", store, "--grace", "0"],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, f"s4fs gc failed: {res.stderr}"
    return res.stdout


# --------------------------------------------------------------------------- 1. overwrite

@pytest.mark.parametrize("mode", MODES)
def test_a_fresh_open_after_an_in_place_overwrite_reads_the_new_version(mount_factory, mode):
    """The issue-28 reproduction: a reader keeps the file open and reading while it is
    overwritten in place with unaligned writes; the kernel must not keep pages that a
    later open serves as bytes of neither version."""
    m = mount_factory(extra=MODES[mode])
    p = os.path.join(m.path, "model.bin")
    problems = []
    for rnd in range(6):
        old = random_bytes(f"old-{rnd}", 8 * MiB)
        new = random_bytes(f"new-{rnd}", 8 * MiB)
        write_in_pieces(p, old)
        r = os.open(p, os.O_RDONLY)
        try:
            assert os.pread(r, len(old) + 1, 0) == old, f"round {rnd}: old does not read back"
            # a read racing the truncate may be old up to a byte and new after it (as on
            # a local disk); new bytes followed by old ones are stale pages
            reader = PreadLoop(r, {"old": old, "new": new}, len(old), switch_ok=True)
            reader.history = {f"{k} of round {j}": random_bytes(f"{k}-{j}", 8 * MiB)
                              for j in range(rnd) for k in ("old", "new")}
            reader.start()
            try:
                write_in_pieces(p, new)
                # the reader is still reading: the fresh open must not care
                got = read_fresh(p)
            finally:
                reader.stop()
            if got != new:
                problems.append(f"round {rnd}: a fresh open after close read "
                                + explain(got, 0, {"old": old, "new": new}))
            problems += reader.report(f"round {rnd}: the descriptor open during the write")
        finally:
            os.close(r)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- 2. torch.save

# A second process that opens the checkpoint once and keeps reading it (one pread per
# read, whole and at random places) until its stdin closes; every read must be a slice of
# one of the versions named on its command line (or, for a read racing an overwrite's
# truncate, one version up to a byte and the next one after it). Prints one JSON line at the end.
TORCH_READER = r"""
import json, os, random, sys, threading
path, *twins = sys.argv[1:]
known = [open(t, "rb").read() for t in twins]
fd = os.open(path, os.O_RDONLY)
first = os.pread(fd, 1 << 28, 0)
halt = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), halt.set()), daemon=True).start()
print("ready" if first == known[0] else "first read is not version 0", flush=True)
rng = random.Random(0)
reads, bad, examples = 0, 0, []
while not halt.is_set():
    size = os.fstat(fd).st_size
    off, n = (0, 1 << 28) if rng.random() < 0.5 else \
        (rng.randrange(size + 1), rng.randint(1, 1 << 20))
    try:
        got = os.pread(fd, n, off)
    except OSError as exc:
        bad += 1
        if len(examples) < 3:
            examples.append(f"pread({n}, {off}) raised {exc!r}")
        continue
    reads += 1
    def switch(old, new):
        # a read racing the overwrite's truncate may hold the old version up to a byte
        # and the new one after it, as on a local disk; bytes of neither never
        n = next((j for j in range(len(got)) if j >= len(old) - off or
                  got[j] != old[off + j]), len(got))
        return got[n:] == new[off + n:off + len(got)]
    if not any(v[off:off + len(got)] == got for v in known) and \
            not any(switch(a, b) for a, b in zip(known, known[1:])):
        bad += 1
        if len(examples) < 3:
            near = [next((j for j in range(len(got))
                          if j >= len(v) - off or got[j] != v[off + j]), len(got))
                    for v in known]
            examples.append(f"{len(got)} bytes at offset {off} part from versions "
                            f"0..{len(known) - 1} at bytes {[off + j for j in near]}")
os.close(fd)
print(json.dumps({"reads": reads, "bad": bad, "examples": examples}), flush=True)
"""


def readline_within(proc: subprocess.Popen, timeout: float) -> str:
    import select
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the helper process said nothing in {timeout} s"
    return proc.stdout.readline().strip()


def small_model(seed: int) -> dict:
    """A small model's state dict: the same shapes for every seed, different values."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(2000, 256, generator=g),
        "block.0.attn.weight": torch.randn(256, 768, generator=g).to(torch.bfloat16),
        "block.0.attn.bias": torch.randn(768, generator=g),
        "block.0.mlp.weight": torch.randn(1024, 256, generator=g).half(),
        "head.weight": torch.randn(256, 1000, generator=g),
        "step": torch.tensor(seed),
    }


@pytest.mark.parametrize("mode", MODES)
def test_torch_load_after_torch_save_over_a_checkpoint_another_process_reads_is_the_new_state(
        mount_factory, tmp_path, mode):
    """torch.save overwrites latest.pt in place while another process keeps it open and
    reading: torch.load through a fresh open gives the new tensors exactly, and the other
    process never reads a mixture of two saves."""
    torch = pytest.importorskip("torch")
    m = mount_factory(extra=MODES[mode])
    states = [small_model(seed) for seed in range(5)]
    twins = []
    for i, sd in enumerate(states):             # byte-for-byte twins need the same file name
        d = tmp_path / f"twin-{i}"
        d.mkdir()
        torch.save(sd, d / "latest.pt")
        twins.append(str(d / "latest.pt"))
    p = os.path.join(m.path, "latest.pt")
    torch.save(states[0], p)
    proc = subprocess.Popen([sys.executable, "-c", TORCH_READER, p, *twins],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    problems = []
    try:
        assert readline_within(proc, 60) == "ready"
        for i in range(1, len(states)):
            torch.save(states[i], p)
            with open(p, "rb") as f:
                got = torch.load(f)
            wrong = [k for k in states[i] if k not in got or got[k].dtype != states[i][k].dtype
                     or not torch.equal(got[k], states[i][k])]
            if wrong:
                problems.append(f"save {i}: torch.load through a fresh open gave other "
                                f"tensors for {wrong}")
            raw = read_fresh(p)
            want = open(twins[i], "rb").read()
            if raw != want:
                problems.append(f"save {i}: a fresh open read " +
                                explain(raw, 0, {"previous": open(twins[i - 1], "rb").read(),
                                                 "saved": want}))
        out, _ = proc.communicate("stop", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, f"the reading process failed (exit {proc.returncode})"
    seen = json.loads(out.strip().splitlines()[-1])
    if seen["bad"]:
        problems.append(f"the other process's open descriptor: {seen['bad']} of "
                        f"{seen['reads'] + seen['bad']} reads were not a slice of one saved "
                        f"version, e.g. {seen['examples']}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- 3. oracle

ORACLE_NAMES = ("a.bin", "b.bin", "c.bin")
WHOLE_ONLY = "c.bin"        # only ever replaced whole (rename over, unlink and recreate),
                            # so readers may mmap it: no inode of it ever shrinks
ORACLE_OPS = 24
ORACLE_SEEDS = (1, 2, 3)


def test_the_oracle_takes_a_torn_read_only_when_every_byte_is_of_a_version_or_zero():
    """The oracle's one allowance (is_torn): a version's bytes up to some point and
    another version's after it, at the same offsets — nothing else."""
    old, new = random_bytes("old", 300_000), random_bytes("new", 120_000)
    assert is_torn(new[:50_000] + old[50_000:200_000], 0, [old, new])
    assert is_torn(old[:10] + new[10:100_000], 0, [old, new])
    assert is_torn(new[1000:5000] + old[5000:9000], 1000, [old, new])
    assert not is_torn(new[:50_000] + old[50_001:200_001], 0, [old, new])  # shifted
    assert not is_torn(new[:50_000] + bytes(10) + old[50_010:60_000], 0, [old, new])
    assert not is_torn(new[:50_000] + old[50_000:60_000] + new[60_000:70_000], 0,
                       [old, new])                                       # three pieces
    assert not is_torn(random_bytes("other", 1000), 0, [old, new])
    assert is_torn(old[:50_000] + bytes(20_000), 0, [old[:50_000], old])   # zeroed tail
    assert not is_torn(old[:50_000] + bytes(20_000) + b"x", 0, [old[:50_000], old])
    # a truncate to 40_000 zeroing the old bytes in place while the read copies them
    holes = old[:50_000] + bytes(64) + old[50_064:60_000] + bytes(900) + old[60_900:]
    assert is_torn(holes, 0, [old, old[:40_000]])
    assert is_torn(holes[45_000:], 45_000, [old, old[:40_000]])
    assert not is_torn(holes, 0, [old, old[:55_000]])       # zeros before the cut
    assert not is_torn(holes, 0, [old])                     # no truncate to explain them
    other = b"\x01" if old[-1] != 1 else b"\x02"       # neither the old byte nor zero
    assert not is_torn(holes[:-1] + other, 0, [old, old[:40_000]])


def oracle_plan(seed: int) -> list[dict]:
    """The writer's ops for one seed: kind, path, new bytes (from the seed), chunking."""
    rng = random.Random(seed)
    ops = [{"kind": "overwrite", "name": n} for n in ORACLE_NAMES]
    for _ in range(ORACLE_OPS):
        name = rng.choice(ORACLE_NAMES)
        kinds = ["rename", "recreate"] if name == WHOLE_ONLY else \
            ["overwrite", "overwrite", "append", "truncate", "rename", "recreate"]
        ops.append({"kind": rng.choice(kinds), "name": name})
    for i, op in enumerate(ops):
        n = rng.choices([0, 5, rng.randint(1, 1 << 16), rng.randint(1 << 16, 3 << 19)],
                        weights=[1, 1, 3, 5])[0]
        if op["kind"] == "append":
            n = min(n, 1 << 18)
        op["data"] = random_bytes(f"{seed}-{i}", n)
        op["piece"] = rng.choice([4097, 65537, PIECE, 1 << 20])
        op["size_frac"] = rng.random() * 1.3          # truncate: to this part of the size
        op["mode"] = rng.choice([0o600, 0o640, 0o644])
    return ops


def apply_op(root: str, op: dict, current: bytes) -> bytes:
    """Apply one op under ``root``; returns what the file holds afterwards."""
    p = os.path.join(root, op["name"])
    kind, data, piece = op["kind"], op["data"], op["piece"]
    if kind == "overwrite":
        write_in_pieces(p, data, piece=piece)
        return data
    if kind == "append":
        write_in_pieces(p, data, mode="ab", piece=piece)
        return current + data
    if kind == "truncate":
        size = int(len(current) * op["size_frac"])
        os.truncate(p, size)
        return current[:size] + bytes(max(0, size - len(current)))
    if kind == "rename":                         # the safetensors >= 0.8 pattern
        tmp = os.path.join(root, f".tmp-{op['name']}")
        write_in_pieces(tmp, data, piece=piece)
        os.rename(tmp, p)
        os.chmod(p, op["mode"])
        return data
    if kind == "recreate":                       # checkpoint rotation, then a new save
        os.unlink(p)
        write_in_pieces(p, data, piece=piece)
        return data
    raise AssertionError(kind)


def result_of(op: dict, current: bytes) -> bytes:
    if op["kind"] == "append":
        return current + op["data"]
    if op["kind"] == "truncate":
        size = int(len(current) * op["size_frac"])
        return current[:size] + bytes(max(0, size - len(current)))
    return op["data"]


def oracle_reader(roots: dict, versions_dir: str, seed: int, who: int, op_index, applied,
                  stop, out_path: str, mapping) -> None:
    """A reader process: threads with long-lived descriptors, fresh opens and mmaps of
    both trees, checking every read against every version written so far (the writer
    saves each version under ``versions_dir`` before it starts making it). ``op_index``
    is the writer's op under way, ``applied`` the last one done on both trees.
    ``mapping`` (tree, op it was mapped at, op now) says what an mmap read was reading,
    should it die of SIGBUS."""
    known: dict[str, list[bytes]] = {n: [] for n in ORACLE_NAMES}
    lock = threading.Lock()
    failures: list[str] = []
    counts = {"reads": 0, "bad": 0, "torn": {t: 0 for t in roots},
              "maps": 0, "maps_mid_write": 0}
    plan = oracle_plan(seed)
    # the ops that truncate a file in place, then write it anew (or only truncate it)
    rewrites = {i: op["name"] for i, op in enumerate(plan)
                if op["kind"] in ("overwrite", "truncate")}
    # the ops during which the path WHOLE_ONLY names a file its writer is still writing
    writes_mapped_name = {i for i, op in enumerate(plan)
                          if op["name"] == WHOLE_ONLY and op["kind"] == "recreate"}

    def versions(name: str, reload: bool) -> list[bytes]:
        with lock:
            if reload:
                d = os.path.join(versions_dir, name)
                files = sorted(f for f in os.listdir(d) if not f.startswith("."))
                for f in files[len(known[name]):]:
                    with open(os.path.join(d, f), "rb") as fh:
                        known[name].append(fh.read())
            return list(known[name])

    def check(tree, how, name, off, got, op_before):
        counts["reads"] += 1
        if is_slice(got, off, versions(name, False)) or \
                is_slice(got, off, versions(name, True)):
            return
        raced = any(rewrites.get(i) == name for i in range(op_before, op_index.value + 1))
        if raced and is_torn(got, off, versions(name, True)):
            # a local disk does this too (seen on the local tree): the bytes are all of
            # versions of this file, torn where the read met the writer's truncate
            counts["torn"][tree] += 1
            return
        counts["bad"] += 1
        if len(failures) < 8:
            other = [f"{n} version {k}" for n in ORACLE_NAMES if n != name
                     for k, v in enumerate(versions(n, True))
                     if got and is_slice(got, off, [v])]
            failures.append(f"seed {seed} ops {op_before}..{op_index.value} reader {who} "
                            f"{tree} {how} {name}: "
                            f"{explain_nearest(got, off, versions(name, False))}"
                            + (f" (it is a slice of {', '.join(other)})" if other else ""))

    def error(tree, how, name, exc):
        counts["bad"] += 1
        if len(failures) < 8:
            failures.append(f"seed {seed} op {op_index.value} reader {who} {tree} {how} "
                            f"{name}: {exc!r}")

    def held(rng):                   # a long-lived descriptor, read at random places
        while not stop.is_set():
            tree, name = rng.choice(list(roots)), rng.choice(ORACLE_NAMES)
            try:
                fd = os.open(os.path.join(roots[tree], name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                for _ in range(rng.randint(3, 12)):
                    op_before = op_index.value
                    size = os.fstat(fd).st_size
                    off = rng.choice([0, rng.randint(0, size + 10)])
                    n = rng.choice([rng.randint(1, 4096), rng.randint(1, 300000), size + 1])
                    check(tree, "held", name, off, os.pread(fd, n, off), op_before)
                    time.sleep(rng.random() * 0.02)
            except OSError as exc:
                error(tree, "held", name, exc)
            finally:
                os.close(fd)

    def fresh(rng):                  # open, one whole read, close
        while not stop.is_set():
            tree, name = rng.choice(list(roots)), rng.choice(ORACLE_NAMES)
            op_before = op_index.value
            try:
                got = read_fresh(os.path.join(roots[tree], name))
            except FileNotFoundError:
                continue
            except OSError as exc:
                error(tree, "fresh", name, exc)
                continue
            check(tree, "fresh", name, 0, got, op_before)
            time.sleep(0.005)

    def mapped(rng):                 # an mmap held while the file is replaced
        while not stop.is_set():
            tree = rng.choice(list(roots))
            done_before, op_before = applied.value, op_index.value
            try:
                f = open(os.path.join(roots[tree], WHOLE_ONLY), "rb")
            except FileNotFoundError:
                continue
            try:
                with f:
                    size = os.fstat(f.fileno()).st_size
                    if not size:
                        continue
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except OSError as exc:
                error(tree, "mmap", WHOLE_ONLY, exc)
                continue
            mapped_at = op_index.value
            if any(done_before < k <= mapped_at and k in writes_mapped_name
                   for k in range(op_before, mapped_at + 1)):
                # mapped while its writer may still have been writing it: the kernel's
                # FUSE (6.18, without its writeback cache) may then fault the mapping
                # inside the size it had — any FUSE filesystem, libfuse's own
                # passthrough_hp too (docs/SEMANTICS.md); a local disk never does.
                # What users map (a file after its writer's close) is held to the rule.
                counts["maps_mid_write"] += 1
                mm.close()
                continue
            counts["maps"] += 1
            with mm:                 # the mapping outlives its descriptor, as torch's does
                for _ in range(rng.randint(3, 12)):
                    op_before = op_index.value
                    mapping[:] = [list(roots).index(tree), mapped_at, op_before]
                    off = rng.randrange(size)
                    n = rng.choice([rng.randint(1, 4096), size])
                    check(tree, "mmap", WHOLE_ONLY, off, mm[off:off + n], op_before)
                    time.sleep(rng.random() * 0.02)

    threads = [threading.Thread(target=fn, args=(random.Random(f"{seed}-{who}-{k}"),),
                                daemon=True)
               for k, fn in enumerate((held, held, fresh, mapped))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)     # polled: Event.wait would make the writer's set() wait for us
    for t in threads:
        t.join(30)
    with open(out_path, "w") as f:
        json.dump({"failures": failures, **counts,
                   "hung": sum(t.is_alive() for t in threads)}, f)


def fresh_mmap_digest(path: str) -> str:
    """Map the file afresh and hash what the mapping shows (run in a helper process: a
    mapping longer than what the kernel can read is SIGBUS)."""
    import hashlib
    with open(path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return hashlib.sha256(mm[:]).hexdigest()


# and the experimental --passthrough, in both commit modes (its daemon needs the
# pyfuse3 built with passthrough: pt_site)
ORACLE_MODES = {**MODES, "passthrough": ("--passthrough",),
                "writeback-passthrough": ("--writeback", "--passthrough")}


@pytest.mark.parametrize("seed", ORACLE_SEEDS)
@pytest.mark.parametrize("mode", ORACLE_MODES)
def test_random_changes_under_concurrent_readers_read_like_a_local_disk(
        mount_factory, tmp_path, mode, seed, request):
    """One writer applies a seeded series of changes (unaligned in-place overwrites,
    appends, truncates, rename over, unlink and recreate) to the mount and to a local
    folder side by side, while two reader processes keep reading both through long-lived
    descriptors, fresh opens and mmaps. After every change a fresh open and a fresh mmap
    of the mount read exactly what the local folder holds, and no read ever returned
    bytes that are not a slice of a version of that file."""
    import concurrent.futures
    import hashlib
    if "passthrough" in mode:
        request.getfixturevalue("pt_site")
    m = mount_factory(extra=ORACLE_MODES[mode])
    local = tmp_path / "local"
    local.mkdir()
    roots = {"mount": m.path, "local": str(local)}
    vdir = tmp_path / "versions"
    for n in ORACLE_NAMES:
        (vdir / n).mkdir(parents=True)

    def keep_version(name: str, k: int, data: bytes) -> None:
        tmp = vdir / name / f".{k:05d}"
        tmp.write_bytes(data)
        os.rename(tmp, vdir / name / f"{k:05d}")

    ops = oracle_plan(seed)
    current = {n: b"" for n in ORACLE_NAMES}
    count = {n: 0 for n in ORACLE_NAMES}
    for op in ops[:len(ORACLE_NAMES)]:             # every file exists before readers start
        keep_version(op["name"], 0, op["data"])
        for root in roots.values():
            apply_op(root, op, b"")
        current[op["name"]], count[op["name"]] = op["data"], 1

    ctx = multiprocessing.get_context("spawn")
    op_index, applied, stop = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Event()
    outs = [str(tmp_path / f"reader-{k}.json") for k in range(2)]
    mappings = [ctx.Array("i", [-1, -1, -1]) for _ in range(2)]
    readers = [ctx.Process(target=oracle_reader, daemon=True,
                           args=(roots, str(vdir), seed, k, op_index, applied, stop,
                                 outs[k], mappings[k]))
               for k in range(2)]
    for r in readers:
        r.start()
    problems = []
    mapper = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)
    try:
        time.sleep(1.0)                              # the readers are up and reading
        for i, op in enumerate(ops[len(ORACLE_NAMES):], start=len(ORACLE_NAMES)):
            op_index.value = i
            name = op["name"]
            want = result_of(op, current[name])
            if op["kind"] == "recreate":
                keep_version(name, count[name], b"")
                count[name] += 1
            keep_version(name, count[name], want)
            count[name] += 1
            for root in roots.values():
                assert apply_op(root, op, current[name]) == want
            applied.value = i
            current[name] = want
            what = f"seed {seed} op {i} ({op['kind']} {name}, {len(want)} bytes)"
            lp, mp_ = os.path.join(local, name), os.path.join(m.path, name)
            assert read_fresh(lp) == want, f"{what}: the local disk disagrees with the plan"
            try:
                got = read_fresh(mp_)
                mode_here = os.stat(mp_).st_mode
            except OSError as exc:
                problems.append(f"{what}: a fresh open of the mount raised {exc!r}")
                continue
            if got != want:
                problems.append(f"{what}: a fresh open read " +
                                explain(got, 0, {"local": want}))
            if mode_here != os.stat(lp).st_mode:
                problems.append(f"{what}: mode {oct(mode_here)} on the mount, "
                                f"{oct(os.stat(lp).st_mode)} on the local disk")
            if want:
                try:
                    digest = mapper.submit(fresh_mmap_digest, mp_).result(timeout=60)
                except concurrent.futures.process.BrokenProcessPool:
                    problems.append(f"{what}: a fresh mmap of the mount died (SIGBUS)")
                    mapper = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)
                except OSError as exc:
                    problems.append(f"{what}: a fresh mmap of the mount raised {exc!r}")
                else:
                    if digest != hashlib.sha256(want).hexdigest():
                        problems.append(f"{what}: a fresh mmap showed other bytes")
            time.sleep(0.05)
            if len(problems) > 10:
                break
    finally:
        stop.set()
        for r in readers:
            r.join(60)
            if r.is_alive():
                r.kill()
                r.join(10)
        mapper.shutdown(cancel_futures=True)
    for k, r in enumerate(readers):
        if r.exitcode == -signal.SIGBUS:
            tree, mapped_at, at = mappings[k][:]
            problems.append(f"seed {seed}: reader {k} died of SIGBUS reading an mmap of "
                            f"{list(roots)[tree]} {WHOLE_ONLY} made at op {mapped_at}, "
                            f"at op {at}")
            continue
        if r.exitcode != 0:
            problems.append(f"seed {seed}: reader {k} died (exit {r.exitcode})")
            continue
        with open(outs[k]) as f:
            seen = json.load(f)
        assert seen["reads"] > 100, f"reader {k} hardly read ({seen['reads']} reads)"
        assert seen["maps"] > 0, f"reader {k} read no mapping (all made mid-write?)"
        print(f"seed {seed} reader {k}: {seen['reads']} reads; torn where they met a "
              f"truncate: {seen['torn']}; mmaps read {seen['maps']}, mapped while "
              f"written and dropped unread {seen['maps_mid_write']}")
        if seen["hung"]:
            problems.append(f"seed {seed}: reader {k} had {seen['hung']} threads hung in "
                            f"a read")
        if seen["bad"]:
            problems.append(f"seed {seed}: reader {k}: {seen['bad']} of {seen['reads']} "
                            f"reads failed or were not a slice of one version, e.g.")
            problems += [f"    {x}" for x in seen["failures"]]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [*MODES, "passthrough"])
def test_mmaps_of_finished_files_survive_checkpoint_rotation(mount_factory, mode, request):
    """torch.load(mmap=True) beside a job that rotates its checkpoint: three processes
    keep mapping the file whose writer has closed it and reading the mapping after
    closing their descriptor, while the writer unlinks it and writes it anew, or renames
    a new one over it. No mapping ever faults (SIGBUS): a file unlinked or
    replaced under a mapping keeps its bytes. (Maps made while the writer is still
    writing can fault in the kernel's FUSE itself: tests/mount/stress_mmap_recreate.py.)
    15 s in the suite (it keeps both cores busy); ``S4FS_STRESS_SECONDS`` longer, for a
    soak."""
    import stress_mmap_recreate
    if "passthrough" in mode:         # maps of the local copy the kernel reads itself
        request.getfixturevalue("pt_site")
    m = mount_factory(extra=ORACLE_MODES[mode])
    seconds = float(os.environ.get("S4FS_STRESS_SECONDS", 15))
    ops, died = stress_mmap_recreate.run(m.path, seconds, ["recreate", "rename"],
                                         after_close=True)
    assert ops > 50, f"the writer hardly ran ({ops} ops)"
    assert not died, f"{died} of 3 readers of mapped, finished files died of SIGBUS " \
                     f"(their report is printed above)"


# --------------------------------------------------------------------------- 4. rename over

def test_rename_over_an_open_file_leaves_its_descriptor_on_the_old_bytes(mounted):
    """The safetensors >= 0.8 save: write a temp file, rename it over the name, chmod.
    A descriptor opened before reads the old file whole (and fstat gives its size);
    fresh opens get the new bytes and the new mode."""
    p = os.path.join(mounted.path, "model.safetensors")
    tmp = os.path.join(mounted.path, ".model.safetensors.tmp")
    old = random_bytes("rename-old", 3 * MiB + 11)
    new = random_bytes("rename-new", 2 * MiB + 7)
    write_in_pieces(p, old)
    fd = os.open(p, os.O_RDONLY)
    try:
        got = os.pread(fd, MiB, 0)
        write_in_pieces(tmp, new)
        os.rename(tmp, p)
        os.chmod(p, 0o600)
        assert read_fresh(p) == new, "a fresh open after the rename does not read the new file"
        assert os.stat(p).st_size == len(new)
        assert os.stat(p).st_mode & 0o777 == 0o600, "the chmod after the rename is not seen"
        assert not os.path.exists(tmp)
        try:
            assert os.fstat(fd).st_size == len(old), "fstat of the old descriptor"
            while len(got) < len(old):
                piece = os.pread(fd, PIECE, len(got))
                assert piece, f"the old descriptor hit EOF at {len(got)} of {len(old)} bytes"
                got += piece
            whole = os.pread(fd, len(old) + 1, 0)
        except OSError as exc:
            pytest.fail(f"the descriptor opened before the rename failed: {exc!r}")
        both = {"old": old, "new": new}
        assert got == old, "the old descriptor read " + explain(got, 0, both)
        assert whole == old, "the old descriptor read " + explain(whole, 0, both)
    finally:
        os.close(fd)
    assert read_fresh(p) == new


# --------------------------------------------------------------------------- 5. in place

IN_PLACE_STEPS = [
    ("append 1 MiB in unaligned pieces", lambda p: write_in_pieces(
        p, random_bytes("append-1", MiB), mode="ab")),
    ("truncate to a smaller size", lambda p: os.truncate(p, 2 * MiB + 17)),
    ("truncate to a larger size", lambda p: os.truncate(p, 4 * MiB + 5)),
    ("append 300001 bytes", lambda p: write_in_pieces(
        p, random_bytes("append-2", 300001), mode="ab")),
    ("overwrite 1 MiB in the middle through r+", lambda p: _write_at(
        p, MiB + 3, random_bytes("middle", MiB))),
    ("ftruncate through the writing descriptor, then write on", lambda p: _truncate_and_write(
        p, 1536 * 1024 + 1, random_bytes("after-ftruncate", 200003))),
    ("overwrite with O_TRUNC", lambda p: write_in_pieces(
        p, random_bytes("overwrite", 3 * MiB // 2))),
    ("truncate to zero", lambda p: os.truncate(p, 0)),
    ("append to the empty file", lambda p: write_in_pieces(
        p, random_bytes("append-3", 700001), mode="ab")),
]


def _write_at(path, off: int, data: bytes) -> None:
    with open(path, "r+b", buffering=0) as f:
        f.seek(off)
        for i in range(0, len(data), PIECE):
            f.write(data[i:i + PIECE])


def _truncate_and_write(path, size: int, data: bytes) -> None:
    with open(path, "r+b", buffering=0) as f:
        f.truncate(size)
        f.seek(0, os.SEEK_END)
        f.write(data)


@pytest.mark.parametrize("mode", MODES)
def test_truncate_and_append_under_an_open_descriptor_read_like_a_local_disk(
        mount_factory, tmp_path, mode):
    """In-place changes reach the same file: after each one, a descriptor opened at the
    start (and kept reading all along) and a fresh open both read exactly what the same
    changes left on a local disk."""
    m = mount_factory(extra=MODES[mode])
    local = tmp_path / "local"
    local.mkdir()
    paths = {"mount": os.path.join(m.path, "train.log"), "local": str(local / "train.log")}
    base = random_bytes("base", 3 * MiB)
    for p in paths.values():
        write_in_pieces(p, base)
    fds = {tree: os.open(p, os.O_RDONLY) for tree, p in paths.items()}
    reader = PreadLoop(fds["mount"], None, MiB, off=MiB // 2)      # keeps the pages busy
    reader.start()
    problems = []
    try:
        for what, step in IN_PLACE_STEPS:
            for p in paths.values():
                step(p)
            want = read_fresh(paths["local"])
            assert os.pread(fds["local"], len(want) + 1, 0) == want    # the reference
            try:
                got = read_fresh(paths["mount"])
                held = os.pread(fds["mount"], len(want) + MiB, 0)
                held_size = os.fstat(fds["mount"]).st_size
            except OSError as exc:
                problems.append(f"after {what}: reading the mount raised {exc!r}")
                continue
            if got != want:
                problems.append(f"after {what}: a fresh open read " +
                                explain(got, 0, {"the local file": want}))
            if held != want:
                problems.append(f"after {what}: the descriptor opened before read " +
                                explain(held, 0, {"the local file": want}))
            if held_size != len(want):
                problems.append(f"after {what}: fstat of the descriptor opened before says "
                                f"{held_size} bytes, the local file has {len(want)}")
    finally:
        reader.stop()
        for fd in fds.values():
            os.close(fd)
    problems += [f"the reading descriptor: {f}" for f in reader.failures]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- 6. two mounts

@pytest.mark.parametrize("store_kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_another_mount_reads_one_version_whole_and_the_new_one_after_the_metadata_lifetime(
        mount_factory, tmp_path, request, store_kind):
    """Two nodes on one store. Node A overwrites a file in place; on node B every fresh
    open reads one committed version whole, a long-lived descriptor reads slices of one
    version (or, for a read in flight at the switch, the old one up to a byte and the new
    one after it: never bytes of neither, never stale pages), and once the metadata lifetime has passed since A's close() B reads the new
    version exactly."""
    if store_kind == "s3":
        store = s3_url(request)
    else:
        store = str(tmp_path / "shared-store")
        os.makedirs(store)
    a = mount_factory(store=store, name="a")
    versions = {f"v{i}": random_bytes(f"node-{i}", 4 * MiB + 12345 * i) for i in range(4)}
    pa = os.path.join(a.path, "ckpt.bin")
    write_in_pieces(pa, versions["v0"])
    b = mount_factory(store=store, name="b")
    pb = os.path.join(b.path, "ckpt.bin")
    assert read_fresh(pb) == versions["v0"]
    committed = {"v0": versions["v0"]}
    fresh_failures: list[str] = []
    halt = threading.Event()

    def fresh_opens():
        while not halt.is_set():
            try:
                got = read_fresh(pb)
            except OSError as exc:
                fresh_failures.append(f"a fresh open on B raised {exc!r}")
                continue
            if got not in committed.values() and len(fresh_failures) < 5:
                fresh_failures.append("a fresh open on B read " + explain(got, 0, committed))

    fd = os.open(pb, os.O_RDONLY)
    # a read that is in flight when B switches to the new version may span the switch
    held = PreadLoop(fd, committed, 5 * MiB, switch_ok=True)
    opener = threading.Thread(target=fresh_opens, daemon=True)
    held.start()
    opener.start()
    problems = []
    try:
        for i in range(1, 4):
            old, new = versions[f"v{i - 1}"], versions[f"v{i}"]
            committed[f"v{i}"] = new         # (before the write: B may see it from close on)
            write_in_pieces(pa, new)
            closed = time.monotonic()
            got = read_fresh(pb)
            if got != old and got != new:
                problems.append(f"write {i}: B's first open after A's close read " +
                                explain(got, 0, {"old": old, "new": new}))
            time.sleep(max(0.0, closed + METADATA_LIFETIME - time.monotonic()))
            got = read_fresh(pb)
            if got != new:
                problems.append(f"write {i}: {METADATA_LIFETIME} s after A's close B read " +
                                explain(got, 0, {"old": old, "new": new}))
    finally:
        halt.set()
        opener.join(60)
        held.stop()
        os.close(fd)
    assert not opener.is_alive(), "a fresh open on B hangs"
    problems += fresh_failures + held.report("B's long-lived descriptor")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- 7. unlink

@pytest.mark.parametrize("store_kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_an_unlinked_open_file_reads_its_original_bytes_also_across_gc(
        mount_factory, tmp_path, request, store_kind):
    """Checkpoint rotation deletes a file a reader still has open: the reader keeps
    reading the original bytes to the end, fstat works, and ``s4fs gc --grace 0`` run
    meanwhile does not free what the open file still needs. The reading node never had
    the file in its caches, so its reads after gc come from the store."""
    if store_kind == "s3":
        store = s3_url(request)
    else:
        store = str(tmp_path / "shared-store")
        os.makedirs(store)
    w = mount_factory(store=store, name="writer")
    data = random_bytes("rotated", 20 * MiB)
    write_in_pieces(os.path.join(w.path, "ckpt_100.pt"), data)
    r = mount_factory(store=store, name="reader")
    p = os.path.join(r.path, "ckpt_100.pt")
    fd = os.open(p, os.O_RDONLY)
    got = bytearray()
    try:
        def read_until(end: int) -> None:
            while len(got) < end:
                piece = os.pread(fd, PIECE, len(got))
                assert piece, f"EOF at {len(got)} of {len(data)} bytes"
                got.extend(piece)

        read_until(2 * MiB)
        os.unlink(p)
        assert not os.path.exists(p)
        try:
            assert os.fstat(fd).st_size == len(data), "fstat after unlink"
            read_until(6 * MiB)
            gc_now(store)
            read_until(len(data))
            whole = os.pread(fd, len(data) + 1, 0)
        except OSError as exc:
            pytest.fail(f"reading the unlinked file through its descriptor, at byte "
                        f"{len(got)}, raised {exc!r}")
        assert bytes(got) == data, \
            "read in pieces: " + explain(bytes(got), 0, {"the file": data})
        assert whole == data, "read whole after gc: " + explain(whole, 0, {"the file": data})
    finally:
        os.close(fd)
    assert not os.path.exists(p)


def test_an_unlinked_file_open_for_writing_still_reads_and_writes_through_its_descriptor(
        mounted):
    """pjdfstest unlink/14.t: a file open for writing is unlinked; fstat, write and read
    through its descriptor go on working, and the name does not come back at close."""
    p = os.path.join(mounted.path, "scratch.bin")
    first = random_bytes("scratch-1", 300001)
    more = random_bytes("scratch-2", 70001)
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.write(fd, first) == len(first)
        os.unlink(p)
        assert not os.path.exists(p)
        try:
            assert os.fstat(fd).st_size == len(first), "fstat after unlink"
            assert os.pwrite(fd, more, len(first)) == len(more)
            assert os.fstat(fd).st_size == len(first) + len(more)
            back = os.pread(fd, len(first) + len(more) + 1, 0)
        except OSError as exc:
            pytest.fail(f"using the unlinked file's descriptor raised {exc!r}")
        assert back == first + more, explain(back, 0, {"what was written": first + more})
    finally:
        os.close(fd)
    mounted.sync()
    assert not os.path.exists(p), "the unlinked file came back at close"
    assert "scratch.bin" not in os.listdir(mounted.path)

"""The runner's boot-time codec self-check: a fast lossless round trip.

Compresses and decompresses a small adversarial set — every bit pattern of the 16- and
8-bit float types, fp32/fp64 specials (NaN payloads, ±Inf, denormals, -0.0) mixed into
normal values, random bytes of awkward lengths, and XOR deltas — on the configured
device, and fails unless every byte comes back. It is ``s4fs selftest`` with small random
sets (on a GPU that includes the batch and cross-device paths), or, where that module is
missing, the same round trips done here. It takes well under a second on a CPU. The full
``s4fs selftest`` is the image build's gate.
"""

from __future__ import annotations

import io
import logging
import re
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelfCheckResult:
    ok: bool
    detail: str
    cases: int
    seconds: float


def _cases():
    from s4fs.testing import adversarial as A
    yield from ((n, d, x, None) for n, d, x in A.exhaustive())
    yield from ((n, d, x, None) for n, d, x in A.specials(n_random=4096))
    yield from ((n, d, x, None) for n, d, x in A.random_bytes())
    if hasattr(A, "delta_cases"):
        yield from A.delta_cases()


#: elements in the random data sets at boot (the image gate uses a million)
BOOT_RANDOM_SIZE = 4096


def run(device: str = "auto") -> SelfCheckResult:
    """Round-trip the adversarial set through ``s4fs.codec`` on ``device``."""
    try:
        from s4fs import selftest
    except ImportError:
        return _builtin(device)
    return _via_selftest(selftest, device)


def _via_selftest(selftest, device: str) -> SelfCheckResult:
    t0 = time.perf_counter()
    out = io.StringIO()
    try:
        status = selftest.run(device, n_random=BOOT_RANDOM_SIZE, out=out)
    except Exception as exc:
        return SelfCheckResult(False, f"codec self-check crashed (device {device}): "
                               f"{type(exc).__name__}: {exc}", 0, time.perf_counter() - t0)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    summary = lines[-1] if lines else f"s4fs selftest exited with {status}"
    m = re.match(r"(\d+)/(\d+) round trips", summary)
    cases = int(m.group(2)) if m else 0
    if status == 0:
        return SelfCheckResult(True, summary, cases, time.perf_counter() - t0)
    failures = [line for line in lines if line.startswith("FAIL ")][:3]
    detail = "; ".join([summary] + failures)
    if status == 1:                          # ran, and something was not bit-exact
        detail += "; do not use this build"
    return SelfCheckResult(False, detail, cases, time.perf_counter() - t0)


def _builtin(device: str) -> SelfCheckResult:
    t0 = time.perf_counter()
    n = 0
    try:
        from s4fs.codec import compress, decompress
        for name, dtype, data, base in _cases():
            n += 1
            blob = compress(data, dtype, base=base, device=device)
            back = decompress(blob, base=base, device=device)
            if bytes(back) != bytes(data):
                first = next((i for i, (a, b) in enumerate(zip(back, data)) if a != b),
                             min(len(back), len(data)))
                return SelfCheckResult(False, f"round trip of {name!r} ({dtype}, device "
                                       f"{device}) is not bit-exact: first difference at byte "
                                       f"{first} of {len(data)}; do not use this build",
                                       n, time.perf_counter() - t0)
    except Exception as exc:
        return SelfCheckResult(False, f"codec self-check failed on case {n} (device {device}): "
                               f"{type(exc).__name__}: {exc}", n, time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    return SelfCheckResult(True, f"{n} adversarial round trips bit-exact on device {device} "
                           f"in {dt:.2f} s", n, dt)

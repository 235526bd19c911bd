"""How the GPU path codes planes: a frozen, JSON-round-tripping config."""

from __future__ import annotations

from dataclasses import asdict, dataclass

CODECS = ("ans", "gdeflate", "deflate", "raw")
LAYOUTS = ("float", "sm")


@dataclass(frozen=True)
class GpuProfile:
    """Which nvCOMP codec codes which plane role.

    * ``exponent`` — exponent planes of floats and the 7-bit magnitude plane of fp8.
    * ``mantissa`` — mantissa planes of floats.
    * ``other`` — sign planes, byte-grouped integer planes and flat (byte) planes.

    Each is ``"ans"`` (nvCOMP ANS over bytes, GPU-only), ``"gdeflate"`` (nvCOMP GDeflate;
    CPU-decodable where nvCOMP's CPU library is installed), ``"deflate"`` (nvCOMP
    Deflate; any CPU decodes it with zlib) or ``"raw"`` (not coded). ``chunk`` is
    nvCOMP's chunk size in bytes, ``zero_chunk`` the one for planes in which at least
    ``zero_chunk_share`` of the sampled bytes are zero: ANS pays a fixed cost per chunk, so
    larger chunks store dense planes smaller, but a chunk mixing a zero stretch with
    dense bytes codes both with one table (so the larger chunk helps dense weights a
    little and costs AdamW's sparse state more; bench/gpu_gap_model.py's coder model
    picks the smaller chunk for planes with a few per cent of zero bytes). The payload records
    each plane's chunk size. Planes that do not shrink are stored raw and constant
    planes as one byte, whatever the profile.

    ``max_entropy``: planes whose sampled order-0 entropy is at least this many bits
    per byte are stored raw without trying the codec (ANS cannot beat the entropy).
    ``ans_states``: nvCOMP ANS interleaved states per lane; only 0 (nvCOMP's choice) is
    accepted: the ANS payload does not record the setting, and nvCOMP decodes other
    settings wrong without it (checksum mismatches on fp32, which the container's
    checksums caught).
    ``zero_runs``: ``"gdeflate"`` codes planes in which at least ``zero_share`` of the
    sampled bytes are zero with nvCOMP GDeflate's LZ mode (algorithm 1) instead of the
    plane's codec: runs of zeros (optimizer state of rows that saw no gradient, deltas)
    cost ANS a fixed amount per chunk, LZ almost nothing; ``"off"`` keeps the role's codec.
    ``verify``: decode every blob on the device right after writing it and check it
    against its checksum; a blob that does not restore exactly is coded on the CPU
    instead (nvCOMP's ANS output is not byte-for-byte repeatable, and one benchmark run
    saw a blob fail its checksum on decode, so the encoder does not trust it blindly).

    ``zero_blocks``: chunks (not deltas) in which all-zero blocks (4 KiB; larger in
    chunks over 4 MiB) are at least ``zero_block_share`` of the blocks are coded from
    their other blocks only, with a keep map in the container header: optimizer state of
    rows that saw no gradient, padding, pruned weights. ANS codes a zero stretch at a
    cost per byte where the CPU path's coders pay almost nothing (without it AdamW's
    ``exp_avg_sq`` stores larger on the GPU than on the CPU path).

    ``layout``: ``"float"`` writes the ``FLOAT`` plane layout (packed signs, exponent
    planes, mantissa planes); ``"sm"`` writes ``FLOAT_SM`` where the dtype allows it
    (bf16, fp32, complex64: exponent byte, sign|top-7-mantissa byte, lower bytes),
    which holds the same bits in whole bytes.
    """

    name: str = "default"
    exponent: str = "ans"
    mantissa: str = "ans"
    other: str = "ans"
    gdeflate_algorithm: int = 0
    deflate_algorithm: int = 0
    ans_states: int = 0
    chunk: int = 3 << 17
    zero_chunk: int = 1 << 18
    zero_chunk_share: float = 0.05
    layout: str = "sm"
    max_entropy: float = 7.75
    zero_runs: str = "off"
    zero_share: float = 0.25
    zero_blocks: bool = True
    zero_block_share: float = 1 / 32
    verify: bool = True

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown GPU plane layout {self.layout!r}; use one of {LAYOUTS}")
        for role in (self.exponent, self.mantissa, self.other):
            if role not in CODECS:
                raise ValueError(f"unknown GPU plane codec {role!r}; use one of {CODECS}")
        if self.ans_states != 0:
            raise ValueError("ans_states must be 0: ANS planes do not record the setting, so "
                             "nothing could decode them")
        if self.zero_runs not in ("off", "gdeflate"):
            raise ValueError(f"zero_runs must be 'off' or 'gdeflate', not {self.zero_runs!r}")
        for name in ("chunk", "zero_chunk"):
            n = getattr(self, name)
            if n <= 0 or n % 256 or n > 1 << 24:
                raise ValueError(f"{name} must be a positive multiple of 256 bytes, at most "
                                 f"16 MiB")

    @property
    def portable(self) -> bool:
        """True when every plane this profile writes decodes on a CPU with zlib alone."""
        return all(c in ("deflate", "raw") for c in (self.exponent, self.mantissa, self.other))

    def get_config(self) -> dict:
        return asdict(self)

    @classmethod
    def from_config(cls, config: dict) -> "GpuProfile":
        return cls(**config)


# FLOAT_SM planes where the dtype allows, ANS on every plane whose entropy leaves room
# (bf16: the exponent plane only; the sign|mantissa byte is stored as it is)
DEFAULT = GpuProfile()
# the FLOAT layout (packed signs, exponent and mantissa planes), ANS on each
FLOAT = GpuProfile(name="float", layout="float")
# the design's split: ANS on exponents, GDeflate (entropy-only) on mantissas
GDEFLATE_MANTISSA = GpuProfile(name="gdeflate-mantissa", layout="float", mantissa="gdeflate")
# every plane decodes on any CPU (zlib)
# (zero blocks off: Deflate codes zero runs almost for free itself)
PORTABLE = GpuProfile(name="portable", layout="float", exponent="deflate", mantissa="deflate",
                      other="deflate", zero_blocks=False)

# the default, with GDeflate's LZ mode on planes with many zero bytes (optimizer state)
ZERO_RUNS = GpuProfile(name="zero-runs", zero_runs="gdeflate")

PROFILES = {p.name: p for p in (DEFAULT, FLOAT, GDEFLATE_MANTISSA, PORTABLE, ZERO_RUNS)}

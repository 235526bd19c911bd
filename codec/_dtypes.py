"""The dtypes the codec knows, with their stable container codes and bit layouts.

Codes are written into every blob: never renumber one, only add.
"""

from __future__ import annotations

from dataclasses import dataclass

from s4fs.errors import CodecError


@dataclass(frozen=True)
class DType:
    name: str
    code: int                 # stable id written into blobs
    itemsize: int             # bytes per element
    word: int = 0             # bytes per float word (complex types hold two words)
    ebits: int = 0            # exponent bits of a float word (0: not a float layout)
    mbits: int = 0            # mantissa bits of a float word
    signed_float: bool = True

    def __hash__(self) -> int:
        # codes are unique; hashing every field made dicts keyed by dtype cost
        # microseconds per lookup, and the GPU codec looks one up per chunk
        return hash(self.code)

    @property
    def is_float(self) -> bool:
        return self.ebits > 0 and self.signed_float


def _f(name, code, itemsize, word, ebits, mbits):
    return DType(name, code, itemsize, word, ebits, mbits)


def _i(name, code, itemsize):
    return DType(name, code, itemsize)


_ALL = [
    _i("bytes", 0, 1),
    _f("float32", 1, 4, 4, 8, 23),
    _f("float64", 2, 8, 8, 11, 52),
    _f("float16", 3, 2, 2, 5, 10),
    _f("bfloat16", 4, 2, 2, 8, 7),
    _f("float8_e4m3fn", 5, 1, 1, 4, 3),
    _f("float8_e5m2", 6, 1, 1, 5, 2),
    _f("float8_e4m3fnuz", 7, 1, 1, 4, 3),
    _f("float8_e5m2fnuz", 8, 1, 1, 5, 2),
    _f("complex32", 9, 4, 2, 5, 10),
    _f("complex64", 10, 8, 4, 8, 23),
    _f("complex128", 11, 16, 8, 11, 52),
    _i("bool", 20, 1),
    _i("uint8", 21, 1),
    _i("int8", 22, 1),
    _i("int16", 23, 2),
    _i("uint16", 24, 2),
    _i("int32", 25, 4),
    _i("uint32", 26, 4),
    _i("int64", 27, 8),
    _i("uint64", 28, 8),
    # exotic types with no sign/exponent/mantissa split worth making
    _i("float8_e8m0fnu", 40, 1),
    _i("float4_e2m1fn_x2", 41, 1),
    _i("bits8", 42, 1),
    _i("bits16", 43, 2),
    _i("bits1x8", 44, 1),
    _i("bits2x4", 45, 1),
    _i("bits4x2", 46, 1),
    _i("quint8", 47, 1),
    _i("qint8", 48, 1),
    _i("qint32", 49, 4),
    _i("quint4x2", 50, 1),
    _i("quint2x4", 51, 1),
]

BY_NAME: dict[str, DType] = {d.name: d for d in _ALL}
BY_CODE: dict[int, DType] = {d.code: d for d in _ALL}

# torch's own aliases and the names storage classes use
_ALIASES = {
    "float": "float32", "double": "float64", "half": "float16", "cfloat": "complex64",
    "cdouble": "complex128", "chalf": "complex32", "long": "int64", "int": "int32",
    "short": "int16", "byte": "uint8", "char": "int8", "bits16": "bits16",
}


def dtype_names() -> list[str]:
    return sorted(BY_NAME)


def lookup(dtype: object) -> DType:
    """Return the :class:`DType` for a name, a torch dtype or a NumPy dtype."""
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    name = _ALIASES.get(name, name)
    try:
        return BY_NAME[name]
    except KeyError:
        raise CodecError(
            f"unknown dtype {dtype!r}; use one of {', '.join(dtype_names())} "
            f"or 'bytes' for opaque data") from None


def from_code(code: int) -> DType:
    try:
        return BY_CODE[code]
    except KeyError:
        from s4fs.errors import UnsupportedVersionError
        raise UnsupportedVersionError(
            f"blob names dtype code {code}, which this version of s4fs does not know; "
            f"upgrade s4fs to read it") from None

"""Pairs: fp32 words coded on a bf16 or fp16 copy of them (s4fs.codec._pair). Every
input round-trips — exact roundings, copies that are not roundings, random bytes, every
special value — and a wrong or corrupt copy is an error, never other bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from s4fs import codec
from s4fs.codec import _pair
from s4fs.errors import BaseMismatchError, ChecksumError, CodecError, FormatError

KINDS = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def copy_of(master: np.ndarray, kind: str) -> bytes:
    """torch's own rounding of fp32 words to ``kind`` (nearest even), as bytes."""
    t = torch.from_numpy(master.view(np.float32).copy()).to(KINDS[kind])
    return t.view(torch.int16).numpy().tobytes()


def round_trip(master: bytes, copy: bytes, kind: str) -> bytes:
    blob = codec.compress(master, "float32", base=copy, transform="pair", base_dtype=kind)
    assert codec.decompress(blob, base=copy, device="cpu") == master
    assert len(blob) <= len(master) + 64          # never larger than raw plus a header
    return blob


def every_special() -> np.ndarray:
    """fp32 words around every boundary a rounding crosses: NaNs with payloads, ±inf,
    ±0, denormals, the largest finite values, exact ties at every low half."""
    rng = np.random.default_rng(7)
    tops = np.array([0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x477F, 0x7F7F, 0x7F80,
                     0x7FC0, 0x7FFF, 0x8000, 0x8001, 0xBF80, 0xFF7F, 0xFF80, 0xFFC1],
                    dtype=np.uint32)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    grid = (tops[:, None] << 16 | lows[None, :]).ravel()
    return np.concatenate([grid, rng.integers(0, 1 << 32, 4096, dtype=np.uint32)])


@pytest.mark.parametrize("kind", KINDS)
def test_an_exact_rounding_costs_about_the_master_alone(kind):
    rng = np.random.default_rng(0)
    master = (rng.standard_normal(1 << 18) * 0.02).astype(np.float32)
    copy = copy_of(master.view(np.uint32), kind)
    pair = round_trip(master.tobytes(), copy, kind)
    alone = codec.compress(master.tobytes(), "float32")
    copy_alone = codec.compress(copy, kind)
    # the copy and the master coded on it, against the master coded alone
    assert len(pair) + len(copy_alone) <= 1.02 * len(alone)
    # every word within half a step of its copy (fp16: but its denormals, a step wider)
    assert codec.pair_share(master.tobytes(), copy, kind) >= 0.99


@pytest.mark.parametrize("kind", KINDS)
def test_special_values_and_random_words_round_trip(kind):
    master = every_special()
    round_trip(master.tobytes(), copy_of(master, kind), kind)          # torch's rounding
    rng = np.random.default_rng(3)
    junk = rng.integers(0, 1 << 16, len(master), dtype=np.uint16).tobytes()
    round_trip(master.tobytes(), junk, kind)                           # an unrelated copy
    round_trip(rng.bytes(4 * 999), rng.bytes(2 * 999), kind)           # random bytes


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_that_is_not_the_rounding_still_round_trips(kind):
    rng = np.random.default_rng(5)
    master = (rng.standard_normal(1 << 16) * 0.02).astype(np.float32)
    # stochastic rounding: each word rounded up or down at random
    words = master.view(np.uint32)
    up = (words + np.uint32(0xFFFF)) >> np.uint32(16) if kind == "bfloat16" else None
    if kind == "bfloat16":
        copy = np.where(rng.random(len(words)) < 0.5, words >> np.uint32(16), up)
        copy = copy.astype(np.uint16).tobytes()
    else:
        copy = (master + rng.standard_normal(len(master)).astype(np.float32) * 1e-4
                ).astype(np.float16).tobytes()
    round_trip(master.tobytes(), copy, kind)
    # a step taken between the copy and the save
    stepped = (master - 1e-5 * np.sign(master)).astype(np.float32)
    round_trip(stepped.tobytes(), copy_of(master.view(np.uint32), kind), kind)


def test_the_residual_is_an_exact_inverse_on_every_word():
    rng = np.random.default_rng(11)
    m = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint32).tobytes()
    c = rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint16).tobytes()
    for kind in KINDS:
        assert _pair.restore(_pair.residual(m, c, kind), c, kind).tobytes() == m


def test_a_wrong_copy_is_refused_not_decoded_into_other_bytes():
    rng = np.random.default_rng(1)
    master = (rng.standard_normal(4096) * 0.02).astype(np.float32)
    copy = copy_of(master.view(np.uint32), "bfloat16")
    blob = codec.compress(master.tobytes(), "float32", base=copy, transform="pair",
                          base_dtype="bfloat16")
    other = bytearray(copy)
    other[100] ^= 1
    with pytest.raises(BaseMismatchError):
        codec.decompress(blob, base=bytes(other))
    with pytest.raises(BaseMismatchError):
        codec.decompress(blob, base=copy + b"\0\0")
    with pytest.raises(BaseMismatchError):
        codec.decompress(blob)                      # a pair needs its copy
    bad = bytearray(blob)
    bad[-1] ^= 0xFF                                 # a payload byte
    with pytest.raises((ChecksumError, FormatError, CodecError)):
        codec.decompress(bytes(bad), base=copy)


def test_bad_arguments_say_what_a_pair_needs():
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        codec.compress(b"\0" * 8, "bfloat16", base=b"\0" * 4, transform="pair",
                       base_dtype="bfloat16")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        codec.compress(b"\0" * 8, "float32", base=b"\0" * 4, transform="pair",
                       base_dtype="float32")
    with pytest.raises(CodecError, match="half their bytes"):
        codec.compress(b"\0" * 8, "float32", base=b"\0" * 8, transform="pair",
                       base_dtype="bfloat16")


def test_the_pair_flags_are_refused_where_no_writer_sets_them():
    from s4fs.codec import _container as C
    blob = bytearray(codec.compress(b"\1" * 64, "float32", base=b"\1" * 32,
                                    transform="pair", base_dtype="bfloat16"))
    assert C.unpack(bytes(blob)).pair == "bfloat16"
    blob[7] = C.FLAG_PAIR                    # a pair without the delta flag
    with pytest.raises(FormatError, match="pair"):
        C.unpack(bytes(blob))


# --- the other way round: a copy coded on its master ----------------------------------

def on_master_round_trip(copy: bytes, master: bytes, kind: str) -> bytes:
    blob = codec.compress(copy, kind, base=master, transform="on_master")
    assert codec.decompress(blob, base=master, device="cpu") == copy
    assert len(blob) <= len(copy) + 64
    return blob


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_on_its_master_costs_next_to_nothing(kind):
    rng = np.random.default_rng(2)
    master = (rng.standard_normal(1 << 18) * 0.02).astype(np.float32)
    copy = copy_of(master.view(np.uint32), kind)
    assert len(on_master_round_trip(copy, master.tobytes(), kind)) < 256


@pytest.mark.parametrize("kind", KINDS)
def test_the_prediction_is_torchs_rounding_on_every_special_word(kind):
    """The master rounded as torch's ``copy_`` rounds it, NaNs aside (their payloads
    are the machine's): so an exact copy of any master costs nothing."""
    words = every_special()
    want = np.frombuffer(copy_of(words, kind), dtype=np.uint16)
    nan = np.isnan(words.view(np.float32))
    got = _pair.nearest(words, kind)
    assert np.array_equal(got[~nan], want[~nan])


@pytest.mark.parametrize("kind", KINDS)
def test_copies_on_masters_round_trip_whatever_they_hold(kind):
    rng = np.random.default_rng(8)
    words = every_special()
    on_master_round_trip(copy_of(words, kind), words.tobytes(), kind)
    junk = rng.integers(0, 1 << 16, len(words), dtype=np.uint16).tobytes()
    on_master_round_trip(junk, words.tobytes(), kind)                  # an unrelated copy
    on_master_round_trip(rng.bytes(2 * 777), rng.bytes(4 * 777), kind)  # random bytes
    c, m = rng.bytes(2 * 4096), rng.bytes(4 * 4096)
    assert _pair.copy_restore(_pair.copy_residual(c, m, kind), m, kind).tobytes() == c


def test_a_copy_on_the_wrong_master_is_refused():
    rng = np.random.default_rng(4)
    master = (rng.standard_normal(4096) * 0.02).astype(np.float32)
    copy = copy_of(master.view(np.uint32), "bfloat16")
    blob = codec.compress(copy, "bfloat16", base=master.tobytes(), transform="on_master")
    other = bytearray(master.tobytes())
    other[8] ^= 1
    with pytest.raises(BaseMismatchError):
        codec.decompress(blob, base=bytes(other))
    with pytest.raises(BaseMismatchError):
        codec.decompress(blob, base=copy)           # the copy's own length: not a master
    with pytest.raises(BaseMismatchError):
        codec.decompress(blob)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        codec.compress(master.tobytes(), "float32", base=master.tobytes(),
                       transform="on_master")
    with pytest.raises(CodecError, match="half their bytes"):
        codec.compress(copy, "bfloat16", base=copy, transform="on_master")


def test_the_on_master_flag_is_refused_where_no_writer_sets_it():
    from s4fs.codec import _container as C
    blob = bytearray(codec.compress(b"\1" * 32, "bfloat16", base=b"\1" * 64,
                                    transform="on_master"))
    assert C.unpack(bytes(blob)).on_master
    for flags in (C.FLAG_ON_MASTER, C.FLAG_ON_MASTER | C.FLAG_DELTA | C.FLAG_PAIR,
                  C.FLAG_ON_MASTER | C.FLAG_DELTA | C.FLAG_DIFF):
        blob[7] = flags
        with pytest.raises(FormatError, match="pair"):
            C.unpack(bytes(blob))
    blob[7] = C.FLAG_ON_MASTER | C.FLAG_DELTA
    blob[6] = codec.lookup("float32").code          # fp32 words on a master: corrupt
    with pytest.raises((FormatError, ChecksumError, BaseMismatchError)):
        codec.decompress(bytes(blob), base=b"\1" * 64)

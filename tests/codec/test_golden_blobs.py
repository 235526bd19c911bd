"""Golden blobs written once by tests/fixtures/codec/generate.py and never regenerated:
every later s4fs must decode them to the very bytes recorded in MANIFEST.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from s4fs import codec
from s4fs.errors import BaseMismatchError, ChecksumError

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "codec"
MANIFEST = json.loads((HERE / "MANIFEST.json").read_text())


def test_the_fixture_set_is_complete():
    assert len(MANIFEST) >= 10
    for name in MANIFEST:
        assert (HERE / f"{name}.s4ck").exists(), name


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_golden_blob_decodes_to_the_recorded_bytes(name):
    entry = MANIFEST[name]
    blob = (HERE / f"{name}.s4ck").read_bytes()
    assert hashlib.sha256(blob).hexdigest() == entry["blob_sha256"], \
        "a golden blob was changed: golden blobs are never regenerated"
    base = (HERE / entry["base"]).read_bytes() if entry["base"] else None
    out = codec.decompress(blob, base=base, device="cpu")
    assert len(out) == entry["raw_len"]
    assert hashlib.sha256(out).hexdigest() == entry["decoded_sha256"]
    info = codec.inspect(blob)
    assert info.dtype == entry["dtype"] and info.raw_len == entry["raw_len"]


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_golden_blob_corrupted_is_refused(name):
    entry = MANIFEST[name]
    blob = bytearray((HERE / f"{name}.s4ck").read_bytes())
    base = (HERE / entry["base"]).read_bytes() if entry["base"] else None
    blob[10] ^= 0x5A                            # inside the recorded checksum
    with pytest.raises((ChecksumError, BaseMismatchError)):
        codec.decompress(bytes(blob), base=base, device="cpu")

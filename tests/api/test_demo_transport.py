"""``make demo`` tells the user how the bytes went through the mount, from the daemon's
verbose log: through FUSE passthrough, or as FUSE requests and why passthrough was off."""

from __future__ import annotations

from s4fs.demo import _transport


def test_it_says_passthrough_when_a_file_was_written_through_it(tmp_path):
    log = tmp_path / "s4fs-mount.log"
    log.write_text("10:00:00.000 s4fs: INFO s4fs.mount: model.pt: written through FUSE "
                   "passthrough (backing id 1)\n")
    assert _transport(str(log)).startswith("FUSE passthrough:")


def test_it_says_requests_and_why_passthrough_was_off(tmp_path):
    log = tmp_path / "s4fs-mount.log"
    log.write_text("10:00:00.000 s4fs: INFO s4fs.mount: FUSE passthrough off: it needs "
                   "pyfuse3 built with FUSE passthrough (`make passthrough`)\n")
    said = _transport(str(log))
    assert said.startswith("FUSE requests:") and "make passthrough" in said


def test_it_says_requests_without_a_log(tmp_path):
    assert _transport(str(tmp_path / "none.log")).startswith("FUSE requests:")

"""``make demo`` tells the user how the bytes went through the mount, from what
``s4fs status --json`` reports: through FUSE passthrough, or as FUSE requests and why
passthrough was off."""

from __future__ import annotations

from s4fs.demo import _transport


def test_it_says_passthrough_when_the_mount_goes_through_it():
    status = {"transport": "FUSE passthrough (the kernel writes files being saved into "
                           "the local spool and reads local copies itself)"}
    assert _transport(status).startswith("FUSE passthrough:")


def test_it_says_requests_and_why_passthrough_was_off():
    status = {"transport": "FUSE requests (FUSE passthrough off: it needs pyfuse3 built "
                           "with FUSE passthrough (`s4fs build-passthrough`))"}
    said = _transport(status)
    assert said.startswith("FUSE requests:") and "s4fs build-passthrough" in said


def test_it_says_requests_when_the_mount_does_not_say():
    assert _transport({}).startswith("FUSE requests:")

"""Shared pytest setup: markers are declared in pyproject.toml (strict).

Fixture modules owned by each area are imported here so every test sees them.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# the real-model payload the benchmarks share with the tests (bench/_minilm.py; not in
# the package)
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "bench"))

for _mod in ("s3_server", "mount_helpers"):
    try:
        _m = importlib.import_module(_mod)
    except ModuleNotFoundError as _exc:
        if _exc.name != _mod:
            raise
        continue
    globals().update({k: v for k, v in vars(_m).items() if not k.startswith("_")})


def _cuda_ready() -> tuple[bool, str]:
    try:
        from s4fs.codec import gpu_available
    except Exception as exc:  # pragma: no cover
        return False, f"s4fs.codec import failed: {exc}"
    if gpu_available():
        return True, ""
    return False, "no CUDA GPU with CuPy and nvCOMP on this machine"


# The real-kernel suite (marker ``kernel``): the mount tests whose outcome the way bytes
# move between the kernel and the daemon can change — the bytes written and read, the page
# cache and mmap, descriptors held across renames, truncates and unlinks, close() and
# crashes mid-save, fork and dup, a full cache disk. `make test` runs them with every
# mount through FUSE requests, then again through FUSE passthrough (`-m kernel`,
# S4FS_TEST_TRANSPORT=passthrough). Every other test runs once: those that pin their
# transport (tests/mount/test_passthrough.py and the service user's), and those whose
# subject the transport does not touch (names and the CLI, the mount table, the core
# behind the mount, the store behind it: the s3 cases), and a test with a case that pins
# passthrough (its cases through FUSE requests and through passthrough both ran already).
# Names are test functions ("*": every test of the file that mounts); a name that is gone
# fails the collection.
KERNEL_SUITE = {
    "mount/test_coherence.py": ("*",),
    "mount/test_writeback.py": ("*",),
    "mount/test_torch_and_file_tools.py": (
        "test_torch_save_load_unchanged", "test_stored_smaller_and_stat_cli",
        "test_non_torch_and_empty_files", "test_overwrite_checkpoint_in_place",
        "test_append_truncate_and_dd", "test_four_processes_write_at_once",
        "test_kill9_during_save_leaves_no_torn_file", "test_failed_store_makes_close_fail",
        "test_pages_torch_save_wrote_stay_cached_for_the_load",
        "test_pages_stay_cached_for_an_open_before_the_release",
        "test_read_ahead_is_raised_before_the_mount_reports_ready",
        "test_the_kernel_keeps_more_reads_in_flight_when_the_mount_is_ready"),
    "mount/test_trust.py": (
        "test_appends_after_stat_land_at_the_end",
        "test_appends_to_a_torch_file_while_open_see_true_size",
        "test_fork_and_dup_mid_save_commit_no_torn_file",
        "test_torch_save_with_a_forked_child_mid_save",
        "test_full_cache_disk_fails_write_and_close_old_version_stays",
        "test_read_your_writes_on_rdwr", "test_reopen_one_path_300_rounds_never_freezes",
        "test_rename_over_a_file_just_closed", "test_missing_pack_reads_as_eio_not_enoent"),
    "mount/test_mount_cache_in_memory.py": ("test_the_default_mode_keeps_its_cache_in_memory",),
    "mount/test_links_and_owners.py": ("*",),
    "mount/test_cold_push.py": ("*",),
    "core/test_times.py": ("test_utime_round_trips_to_the_nanosecond",
                           "test_a_saved_file_shows_the_time_it_was_saved"),
}
# a test that uses this fixture mounts s4fs through a real kernel: it is a `fuse` test
# whether or not it says so, so `-m "not fuse"` (make check) never needs /dev/fuse
_MOUNTS = "mount_factory"


def _mark_kernel_and_fuse(items) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    checked: set[str] = set()
    for item in items:
        mounts = _MOUNTS in getattr(item, "fixturenames", ())
        if mounts and item.get_closest_marker("fuse") is None:
            item.add_marker(pytest.mark.fuse)
        rel = os.path.relpath(str(item.path), here).replace(os.sep, "/")
        names = KERNEL_SUITE.get(rel)
        if names is None:
            continue
        if rel not in checked:
            checked.add(rel)
            gone = [n for n in names if n != "*" and not hasattr(item.module, n)]
            if gone:
                raise pytest.UsageError(f"tests/conftest.py KERNEL_SUITE names tests that "
                                        f"{rel} no longer has: {', '.join(gone)}")
        if mounts and item.get_closest_marker("s3") is None and \
                ("*" in names or item.originalname in names) and not _pins_passthrough(item):
            item.add_marker(pytest.mark.kernel)


def _pins_passthrough(item) -> bool:
    """Whether one of the test's parametrized cases names passthrough (a mode such as
    ``"writeback-passthrough"``, whose mount passes --passthrough)."""
    for mark in item.iter_markers("parametrize"):
        values = mark.args[1] if len(mark.args) > 1 else mark.kwargs.get("argvalues", ())
        if any("passthrough" in str(v) for v in values):
            return True
    return False


@pytest.hookimpl(tryfirst=True)        # before -m selects by the marks added here
def pytest_collection_modifyitems(config, items):
    _mark_kernel_and_fuse(items)
    # the tests that take a minute or so first: pytest-xdist hands tests out in this
    # order, and one of them started last would keep the whole run waiting for it
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    # by marker, not keyword: every test under tests/gpu/ has the keyword "gpu" (its
    # folder), and the emulated-GPU tests there run on any machine
    gpu_items = [i for i in items if i.get_closest_marker("gpu") is not None]
    if gpu_items:
        ok, why = _cuda_ready()
        if not ok:
            for item in gpu_items:
                item.add_marker(pytest.mark.skip(reason=why))


def pytest_make_parametrize_id(config, val, argname):
    # a long bytes parameter is named by its length, not its content: test ids must not
    # depend on random data (pytest-xdist's workers each collect the suite and must agree
    # on every id)
    if isinstance(val, bytes) and len(val) > 16:
        return f"{argname}-{len(val)}B"
    return None

"""The mount table (s4fs/mtab.py): one parser of /proc/self/mountinfo, read without a
kernel mount from sample lines, and the three places that ask it (the mount daemon,
the health check, the path resolver) answering from a sample table."""

from __future__ import annotations

import pytest

from s4fs import mtab
from s4fs.mtab import MountEntry, fsname_option, mounts_at, parse_mountinfo, s4fs_mount_of

# a root, a tmpfs, an s4fs mount whose mountpoint and store have a space and a comma,
# a second s4fs mount stacked on a dead one, a tmpfs mounted inside an s4fs mount, and
# a bind mount of a folder inside an s4fs mount
SAMPLE = rb"""22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
30 22 0:26 / /tmp rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=1024k
41 22 0:51 / /mnt/my\040disk rw,nosuid,nodev,relatime shared:40 - fuse.s4fs s3://b/p?region=eu%2Cx rw,user_id=0,group_id=0
50 22 0:60 / /mnt/s4 rw,nosuid,nodev,relatime shared:44 - fuse.s4fs /data/old\040store rw,user_id=0
52 50 0:61 / /mnt/s4 rw,nosuid,nodev,relatime shared:45 - fuse.s4fs /data/new\134store rw,user_id=0
60 52 0:70 / /mnt/s4/scratch rw,relatime shared:50 - tmpfs tmpfs rw
70 22 0:61 /runs/7 /work/ckpt rw,relatime master:45 - fuse.s4fs /data/new\134store rw,user_id=0
not a mountinfo line
"""


def test_every_field_of_a_line_is_read_and_unescaped():
    entries = parse_mountinfo(SAMPLE)
    assert len(entries) == 7                          # the junk line is skipped
    assert entries[2] == MountEntry(41, 22, "0:51", "/", "/mnt/my disk", "fuse.s4fs",
                                    "s3://b/p?region=eu%2Cx")
    assert entries[2].is_s4fs and entries[2].is_fuse
    assert entries[2].store == "s3://b/p?region=eu,x"
    assert entries[4].source == "/data/new\\store"    # \134 is a backslash
    assert entries[1].fstype == "tmpfs" and not entries[1].is_fuse
    assert entries[6].root == "/runs/7"


def test_text_parses_as_bytes_do():
    assert parse_mountinfo(SAMPLE.decode()) == parse_mountinfo(SAMPLE)


def test_fsname_option_and_store_are_inverse():
    url = "s3://bucket/prefix?endpoint_url=http://h:9000,region=us-east-1"
    option = fsname_option(url)
    assert "," not in option
    entry = MountEntry(1, 0, "0:1", "/", "/m", "fuse.s4fs", option.removeprefix("fsname="))
    assert entry.store == url


def test_mounts_at_lists_a_stack_with_the_top_last():
    entries = parse_mountinfo(SAMPLE)
    stack = mounts_at("/mnt/s4", entries)
    assert [e.mount_id for e in stack] == [50, 52]
    assert mounts_at("/mnt/my disk", entries)[-1].mount_id == 41
    assert mounts_at("/mnt/s4/", entries)[-1].mount_id == 52
    assert mounts_at("/mnt/nothing", entries) == []


def test_the_stack_order_comes_from_parent_ids_not_line_order():
    lines = SAMPLE.splitlines()
    swapped = b"\n".join([lines[0], lines[4], lines[3]])       # top listed first
    assert [e.mount_id for e in mounts_at("/mnt/s4", parse_mountinfo(swapped))] == [50, 52]


@pytest.mark.parametrize("path, want", [
    ("/mnt/s4", (52, "")),                            # the mountpoint itself
    ("/mnt/s4/run/ckpt_1.pt", (52, "run/ckpt_1.pt")),  # the top of the stack
    ("/mnt/s4x/f", None),                             # a name that only starts alike
    ("/mnt/s4/scratch/f", None),                      # a tmpfs inside the mount holds it
    ("/mnt/my disk/a b.pt", (41, "a b.pt")),
    ("/work/ckpt/step_3.pt", (70, "runs/7/step_3.pt")),   # a bind mount of a folder
    ("/tmp/x", None),
])
def test_the_s4fs_mount_a_path_lies_in(path, want):
    found = s4fs_mount_of(path, parse_mountinfo(SAMPLE))
    assert (found and (found[0].mount_id, found[1])) == want


@pytest.fixture
def sample_table(tmp_path, monkeypatch):
    table = tmp_path / "mountinfo"
    table.write_bytes(SAMPLE)
    monkeypatch.setattr(mtab, "MOUNTINFO", str(table))
    return table


def test_the_path_resolver_the_health_check_and_the_daemon_read_one_table(sample_table):
    from s4fs.mount._daemon import mounts_at as daemon_mounts_at
    from s4fs.paths import mount_of
    from s4fs.service.health import mount_entry
    assert mount_of("/mnt/my disk/x.pt") == ("s3://b/p?region=eu,x", "/mnt/my disk", "x.pt")
    assert mount_of("/tmp/x") is None
    assert mount_entry("/mnt/s4") == ("fuse.s4fs", "/data/new\\store")
    assert mount_entry("/mnt/elsewhere") is None
    assert [e.mount_id for e in daemon_mounts_at("/mnt/s4")] == [50, 52]


def test_an_unreadable_table_is_an_empty_one(tmp_path, monkeypatch):
    monkeypatch.setattr(mtab, "MOUNTINFO", str(tmp_path / "missing"))
    assert mtab.read_mounts() == []
    assert s4fs_mount_of("/mnt/s4/x") is None


def test_this_machines_table_parses_line_for_line():
    with open("/proc/self/mountinfo", "rb") as f:
        lines = f.read().splitlines()
    entries = mtab.read_mounts()
    assert len(entries) == len(lines)
    assert any(e.path == "/" for e in entries)

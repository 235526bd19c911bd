"""The options of `s4fs mount`, declared once (s4fs/options.py): the flags, the -o names
of `mount -t fuse.s4fs` and /etc/fstab, what a background mount hands its daemon, the
service config's mount keys and the README's table all come from that declaration."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from s4fs.cli import build_parser
from s4fs.config import Config, parse_config
from s4fs.options import (BY_O, OPTIONS, SECTIONS, daemon_flags, flags_from_o, markdown,
                          to_flags)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONLY_HERE = {"foreground", "log_file", "ready_fd"}   # the parent's, not the daemon's


def _mount(*flags: str):
    return build_parser().parse_args(["mount", "STORE", "/mnt/s4", *flags])


# every -o name and what it meant before the declaration (mount_helper's old if-chain)
O_MEANT = {
    "allow_other": ["--allow-other"], "cache_dir=/c": ["--cache-dir", "/c"],
    "device=cuda": ["--device", "cuda"], "writeback": ["--writeback"],
    "code_while_written": ["--code-while-written"], "passthrough": ["--passthrough"],
    "nopassthrough": ["--no-passthrough"], "nodelta": ["--no-delta"],
    "forward_deltas": ["--forward-deltas"], "cache_size=20G": ["--cache-size", "20G"],
    "workers=3": ["--workers", "3"], "max_chain_read=1.5": ["--max-chain-read", "1.5"],
    "uid=1000": ["--uid", "1000"], "gid=1001": ["--gid", "1001"],
    "stream_cold_reads": ["--stream-cold-reads"], "push_cold_reads": ["--push-cold-reads"],
    "whole_cold_reads": ["--whole-cold-reads"],
}


@pytest.mark.parametrize("o, flags", sorted(O_MEANT.items()))
def test_each_o_name_means_the_flag_it_always_meant(o, flags):
    warned: list[str] = []
    assert flags_from_o([o], warned.append) == flags
    assert vars(_mount(*flags_from_o([o], warned.append))) == vars(_mount(*flags))
    assert not warned


def test_the_o_names_are_exactly_those_of_before():
    assert set(BY_O) == {o.partition("=")[0] for o in O_MEANT}


def test_generic_mount_options_are_ignored_and_unknown_ones_named():
    warned: list[str] = []
    opts = "rw,noatime,_netdev,nofail,x-systemd.automount,comment=x,nodelta,bogus=1"
    assert flags_from_o(opts.split(","), warned.append) == ["--no-delta"]
    assert warned == ["ignoring unknown option 'bogus=1'"]


def test_the_fstab_form_of_the_mount_test_parses_to_its_flags():
    opts = "rw,noatime,nodelta,nopassthrough,code_while_written,max_chain_read=1.5"
    args = _mount(*flags_from_o(opts.split(","), print))
    assert (args.no_delta, args.passthrough, args.code_while_written,
            args.max_chain_read) == (True, "off", True, 1.5)


@pytest.mark.parametrize("flags", [
    [],
    ["--allow-other", "--cache-dir", "/c", "--device", "cpu", "--uid", "7", "--gid", "8"],
    ["--writeback", "--code-while-written", "--passthrough", "-v"],
    ["--no-passthrough", "--no-delta", "--cache-size", "0", "--gc-interval", "0"],
    ["--forward-deltas", "--max-chain-read", "1.25", "--workers", "4"],
    ["--workers", "0"],                # kept: it codes in the daemon's own threads
    ["-f", "--log-file", "/l", "--ready-fd", "5"],
])
def test_a_background_mount_hands_its_daemon_every_setting(flags):
    args = _mount(*flags)
    again = vars(_mount(*daemon_flags(args)))
    want = vars(args)
    for name in ONLY_HERE:
        want.pop(name), again.pop(name)
    assert again == want


def test_defaults_are_those_of_before():
    args = _mount()
    assert (args.foreground, args.allow_other, args.cache_dir, args.device,
            args.gc_interval, args.uid, args.gid, args.log_file, args.writeback,
            args.code_while_written, args.passthrough, args.no_delta, args.forward_deltas,
            args.max_chain_read, args.cache_size, args.workers, args.ready_fd,
            args.verbose) == (False, False, None, None, 3600.0, None, None, None, False,
                              False, "auto", False, False, None, None, None, None, False)


def test_a_bad_chain_factor_is_refused_saying_what_to_write(capsys):
    with pytest.raises(SystemExit):
        _mount("--max-chain-read", "0.5")
    assert "is not a factor >= 1 (e.g. 1.25" in capsys.readouterr().err


def test_the_declaration_is_consistent():
    flags = [f for o in OPTIONS for f in o.flags]
    assert len(flags) == len(set(flags))
    os_ = [o.o for o in OPTIONS if o.o]
    assert len(os_) == len(set(os_))
    assert all(o.section in SECTIONS for o in OPTIONS)
    assert all(o.help or o.doc for o in OPTIONS), "every option says what it does"
    shared = [o.name for o in OPTIONS if [p.name for p in OPTIONS].count(o.name) > 1]
    assert all(o.is_switch for o in OPTIONS if o.name in shared)   # only tri-state switches


def test_help_lists_every_option_but_the_hidden_ones():
    res = subprocess.run([sys.executable, "-m", "s4fs.cli", "mount", "--help"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    for o in OPTIONS:
        for flag in o.flags:
            assert (flag in res.stdout) != o.hidden, flag
        if o.help and not o.hidden:
            assert " ".join(o.help.split()[:6]) in " ".join(res.stdout.split())


def test_the_config_file_keys_shared_with_the_mount_are_declared_options():
    from s4fs.config import _TABLES
    own = {"store", "mountpoint", "source"} | set(_TABLES)
    assert {f.name for f in dataclasses.fields(Config)} - own == \
        {o.name for o in OPTIONS if o.config}


@pytest.mark.parametrize("text", [
    "", 'cache_dir = "/srv/cache"\ndevice = "cuda"\nallow_other = false\n',
])
def test_the_config_gives_the_mount_its_values(text):
    from s4fs.service.supervisor import mount_argv
    cfg = parse_config(text)
    args = _mount(*cfg.mount_flags())
    assert (args.cache_dir, args.device, args.allow_other) == \
        (cfg.cache_dir, cfg.device, cfg.allow_other)
    # the runner's own command line says the same
    theirs = build_parser().parse_args(mount_argv(cfg)[3:])
    assert (theirs.cache_dir, theirs.device, theirs.allow_other) == \
        (args.cache_dir, args.device, args.allow_other)


def test_to_flags_leaves_out_defaults_and_absent_names():
    assert to_flags({"passthrough": "auto", "writeback": False, "workers": None}) == []
    assert to_flags({"passthrough": "off", "workers": 0}) == ["--no-passthrough",
                                                              "--workers", "0"]


def test_the_markdown_table_has_a_row_per_shown_option():
    table = markdown()
    for o in OPTIONS:
        assert (f"`{o.flags[0]}" in table) != o.hidden
        if o.o and not o.hidden:
            assert f"`{o.o}" in table
    res = subprocess.run([sys.executable, "-m", "s4fs.options", "--markdown"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout == table


def test_the_readme_table_is_the_generated_one():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    begin, end = "<!-- options:begin -->", "<!-- options:end -->"
    if begin not in text or end not in text:
        pytest.skip(f"README.md has no {begin} ... {end} block yet")
    block = text.split(begin, 1)[1].split(end, 1)[0]
    assert block.strip() == markdown().strip(), \
        "README.md's options table is stale: replace the block with the output of " \
        "`python -m s4fs.options --markdown`"

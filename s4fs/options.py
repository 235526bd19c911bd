"""The options of ``s4fs mount``, declared once.

Each option is one :class:`Option` row of :data:`OPTIONS`, and everything that names
or describes a mount option is generated from those rows:

* the ``s4fs mount`` flags and their ``--help`` (:func:`add_arguments`);
* the ``-o`` names that ``mount -t fuse.s4fs`` and /etc/fstab hand to
  ``mount.fuse.s4fs`` (:func:`flags_from_o`);
* the command line a background mount gives its daemon (:func:`daemon_flags`);
* the keys the service's config.toml shares with the mount (``config=True``;
  ``s4fs.config.Config.mount_flags``);
* the README's table of options (:func:`markdown`, ``python -m s4fs.options --markdown``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from s4fs.codec import AUTO_GPU_BELOW_CORES, DEVICES

#: the groups the docs' table shows the options in, in this order
SECTIONS = ("access", "cache", "coding", "writes", "deltas", "daemon")

#: generic mount(8) options ``mount.fuse.s4fs`` accepts and ignores (so do ``x-*``,
#: ``comment*``)
GENERIC_O = frozenset({"rw", "ro", "defaults", "auto", "noauto", "user", "nouser", "users",
                       "_netdev", "nofail", "dev", "nodev", "suid", "nosuid", "exec",
                       "noexec", "atime", "noatime", "relatime"})


@dataclass(frozen=True)
class Option:
    """One option of ``s4fs mount``.

    ``type`` None makes a switch: it takes no value and sets ``name`` to ``const``.
    Two switches may set one name (``--passthrough`` "on", ``--no-passthrough`` "off").
    """

    name: str                          # attribute of the parsed arguments (argparse dest)
    flags: tuple[str, ...]             # as --help lists them; the first is forwarded
    o: str | None                      # the -o name (mount -t fuse.s4fs, fstab); None: none
    section: str                       # one of SECTIONS
    help: str = ""                     # what --help says ("": nothing)
    doc: str = ""                      # the docs' table's line, where shorter than help
    type: Callable[[str], Any] | None = None
    default: Any = None
    const: Any = True
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    daemon: bool = True                # a background mount passes it on to its daemon
    config: bool = False               # also a top-level key of the service's config.toml
    hidden: bool = False               # internal: left out of --help and the docs

    @property
    def is_switch(self) -> bool:
        return self.type is None

    @property
    def shown_value(self) -> str:
        """The value's placeholder, as --help shows it."""
        if self.choices:
            return "{" + ",".join(self.choices) + "}"
        return self.metavar or self.name.upper()


def _chain_factor(text: str) -> float:
    """``--max-chain-read``'s value: a number >= 1."""
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not x >= 1.0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a factor >= 1 (e.g. 1.25; 1 stores every change whole)")
    return x


OPTIONS: tuple[Option, ...] = (
    Option("foreground", ("--foreground", "-f"), None, section="daemon", daemon=False,
           doc="stay in the foreground"),
    Option("allow_other", ("--allow-other",), "allow_other", section="access", config=True,
           doc="other users may use the mount"),
    Option("cache_dir", ("--cache-dir",), "cache_dir", section="cache", type=str, config=True,
           doc="spools, journal and local copies (one mount per dir; default a temporary "
               "one)"),
    Option("device", ("--device",), "device", section="coding", type=str, config=True,
           choices=tuple(DEVICES),
           help="where new chunks are coded and cold files decoded ahead: cpu "
                "(default: worker processes; files any machine reads), cuda (the "
                "GPU worker, in batches; nvCOMP ANS planes, read where a GPU is) "
                "or auto (the GPU on machines with fewer than "
                f"{AUTO_GPU_BELOW_CORES} cores, else the CPU)",
           doc="`cpu` (default), `cuda` or `auto`: where chunks are coded and cold files "
               "decoded ahead"),
    Option("gc_interval", ("--gc-interval",), None, section="daemon", type=float,
           default=3600.0,
           help="seconds between background garbage collections (0: never)"),
    Option("uid", ("--uid",), "uid", section="access", type=int,
           help="the owner shown for files and folders that record none (made by an "
                "older s4fs, or by the Python API); default: the daemon's user"),
    Option("gid", ("--gid",), "gid", section="access", type=int,
           help="the group shown for files and folders that record none"),
    Option("log_file", ("--log-file",), None, section="daemon", type=str, daemon=False,
           help="daemon log (default: CACHE_DIR/s4fs-mount.log)"),
    Option("writeback", ("--writeback",), "writeback", section="writes",
           help="close() returns once the bytes are on local disk; commits run in "
                "the background (journalled; `s4fs sync` waits for them)",
           doc="`close()` returns once the bytes are on local disk; commits run in the "
               "background (`s4fs sync` waits for them)"),
    Option("code_while_written", ("--code-while-written",), "code_while_written",
           section="writes",
           help="with --writeback under FUSE passthrough: code a file while the "
                "kernel writes it, not only once close() accepted it (in the "
                "store a little sooner; the coding then competes with the save)",
           doc="with `--writeback` under passthrough: code while the kernel writes"),
    Option("passthrough", ("--passthrough",), "passthrough", section="writes",
           const="on", default="auto",
           help="insist on FUSE passthrough: the kernel writes a file being saved "
                "straight into its spool, and reads a file kept whole on local "
                "disk straight from it (Linux >= 6.9, root, and pyfuse3 built with "
                "it — `s4fs build-passthrough`, docs/OPERATING.md). Default: used where "
                "all three are there, else FUSE requests (the log says why)",
           doc="insist on FUSE passthrough (refuse to mount without it; default: used "
               "where it can be)"),
    Option("passthrough", ("--no-passthrough",), "nopassthrough", section="writes",
           const="off", default="auto",
           help="never use FUSE passthrough: every read and write is a FUSE request"),
    Option("no_delta", ("--no-delta",), "nodelta", section="deltas",
           help="store every file whole, never as a delta of the previous "
                "checkpoint (each stands alone; more bytes stored)",
           doc="store every file whole"),
    Option("forward_deltas", ("--forward-deltas",), "forward_deltas", section="deltas",
           help="store each new checkpoint as a delta of the one before (the chain "
                "read budget, --max-chain-read, bounds what a fresh node reads). "
                "Default: backward deltas — the newest checkpoint whole, the one "
                "before re-expressed as deltas on it in the background "
                "(docs/DELTA.md)",
           doc="each new checkpoint a delta of the one before (default: the newest "
               "whole, the one before re-expressed on it)"),
    Option("max_chain_read", ("--max-chain-read",), "max_chain_read", section="deltas",
           type=_chain_factor, metavar="X",
           help="with --forward-deltas, a checkpoint is stored as a delta of the "
                "one before only while "
                "the chunk's delta chain holds at most X times the bytes of its "
                "last whole copy: what a fresh node fetches and decodes to load "
                "it (default 1.25; 1 stores every change whole, larger values "
                "trade slower fresh-node loads for fewer stored bytes)",
           doc="forward chains' read budget (default 1.25)"),
    Option("cache_size", ("--cache-size",), "cache_size", section="cache", type=str,
           help="disk kept for whole files just written or read (e.g. 20G; 0: "
                "off; default a quarter of the cache disk's free space, <= 64G)",
           doc="local copies kept (e.g. 20G; default a quarter of the free space, at most "
               "64G; 0: off)"),
    Option("cold_reads", ("--push-cold-reads",), "push_cold_reads", section="cache",
           const="push",
           help="a file that has no local copy yet (a fresh node) is opened at once and "
                "read through the page cache while it is decoded, the daemon pushing "
                "each decoded part into that cache as it lands (reads ahead of it wait "
                "for their part in the daemon); the default on a machine of 4 cores or "
                "more",
           doc="read a cold file while it is decoded, its decoded parts pushed into the "
               "kernel's page cache as they land (the default from 4 cores)"),
    Option("cold_reads", ("--whole-cold-reads",), "whole_cold_reads", section="cache",
           const="whole",
           help="a file that has no local copy yet (a fresh node): under FUSE passthrough "
                "its open waits until it is decoded onto local disk, then the kernel "
                "reads that copy (else it is read through the daemon as it is decoded); "
                "the default below 4 cores, where the decode takes every core",
           doc="under passthrough, a cold file's open waits for its whole decoded copy "
               "(the default below 4 cores)"),
    Option("cold_reads", ("--stream-cold-reads",), "stream_cold_reads", section="cache",
           const="stream",
           help="under FUSE passthrough, read a file that has no local copy yet through "
                "the daemon while it is decoded (the first bytes sooner), instead of its "
                "open waiting until it is decoded onto local disk and the kernel reading "
                "that copy; for tools that read a little of many large files",
           doc="under passthrough, read a cold file through the daemon while it is "
               "decoded instead of waiting at its open for the whole copy"),
    Option("workers", ("--workers",), "workers", section="coding", type=int,
           help="coding worker processes (default: one per core; 0: code in the "
                "daemon's own threads)"),
    Option("ready_fd", ("--ready-fd",), None, section="daemon", type=int, daemon=False,
           hidden=True, doc="the descriptor the daemon writes to once it is mounted"),
    Option("verbose", ("-v", "--verbose"), None, section="daemon",
           doc="log at INFO level, not only warnings and errors"),
)

#: -o name -> option
BY_O: dict[str, Option] = {o.o: o for o in OPTIONS if o.o}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``s4fs mount`` flags, in declaration order."""
    for o in OPTIONS:
        kw: dict[str, Any] = {"dest": o.name, "default": o.default,
                              "help": argparse.SUPPRESS if o.hidden else (o.help or None)}
        if o.is_switch:
            kw.update(action="store_const", const=o.const,
                      default=False if o.default is None else o.default)
        else:
            kw.update(type=o.type, metavar=o.metavar,
                      choices=list(o.choices) if o.choices else None)
        parser.add_argument(*o.flags, **kw)


def to_flags(values: Mapping[str, Any], options: Iterable[Option] = OPTIONS) -> list[str]:
    """The flags that give ``values`` (name -> value, e.g. ``vars(args)``) to ``s4fs
    mount``. Left out: options missing from ``values``, a switch at its default, a
    value of None."""
    out: list[str] = []
    for o in options:
        if o.name not in values:
            continue
        v = values[o.name]
        if o.is_switch:
            if v == o.const and v != o.default:
                out.append(o.flags[0])
        elif v is not None:
            out += [o.flags[0], str(v)]
    return out


def daemon_flags(args: argparse.Namespace) -> list[str]:
    """What a background mount passes on to its daemon, from its own parsed flags."""
    return to_flags(vars(args), [o for o in OPTIONS if o.daemon])


def flags_from_o(opts: Iterable[str], warn: Callable[[str], None]) -> list[str]:
    """``s4fs mount`` flags for the ``-o`` options of ``mount -t fuse.s4fs`` / fstab
    (``writeback``, ``cache_dir=D``, ...); generic mount options are ignored, and
    ``warn`` is told of each unknown one."""
    out: list[str] = []
    for item in opts:
        key, _, value = item.partition("=")
        opt = BY_O.get(key)
        if opt is not None:
            out += [opt.flags[0]] if opt.is_switch else [opt.flags[0], value]
        elif not (key in GENERIC_O or key.startswith(("x-", "comment"))):
            warn(f"ignoring unknown option {item!r}")
    return out


def markdown() -> str:
    """The table of mount options for the docs (README.md between its
    ``<!-- options:begin -->`` and ``<!-- options:end -->`` markers)."""
    rows = ["| `s4fs mount` | `-o` (fstab) | what it does |", "|---|---|---|"]
    for section in SECTIONS:
        for o in OPTIONS:
            if o.section != section or o.hidden:
                continue
            value = "" if o.is_switch else " " + o.shown_value
            flag = ", ".join(f"`{f}{value}`" for f in o.flags)
            o_name = "–" if not o.o else f"`{o.o}`" if o.is_switch else \
                f"`{o.o}={o.shown_value}`"
            default = "" if o.is_switch or o.default is None else \
                f"; default {o.default:g}" if isinstance(o.default, float) else \
                f"; default {o.default}"
            what = ((o.doc or o.help) + default).replace("|", "\\|")
            rows.append(f"| {flag} | {o_name} | {what} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m s4fs.options",
                                description="the options of `s4fs mount`, declared once")
    p.add_argument("--markdown", action="store_true",
                   help="print the docs' table of mount options (markdown)")
    args = p.parse_args(argv)
    if not args.markdown:
        p.print_help()
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())

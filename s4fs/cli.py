"""The ``s4fs`` command line. It builds a config and calls the Python API; subcommands
owned by other modules (``selftest``, ``runner``) get the rest of the arguments."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module whose main(argv) -> int handles it
_DELEGATED = {
    "selftest": "s4fs.selftest",
    "runner": "s4fs.service.runner",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        mod = importlib.import_module(_DELEGATED[argv[0]])
        return int(mod.main(argv[1:]) or 0)
    parser = argparse.ArgumentParser(prog="s4fs", description=__doc__)
    parser.add_subparsers(dest="cmd")
    args = parser.parse_args(argv)
    parser.print_help()
    return 0 if args.cmd is None else 2


def mount_helper(argv: list[str] | None = None) -> int:
    """Entry point of ``mount.fuse.s4fs`` (``mount -t fuse.s4fs``)."""
    raise SystemExit("mount helper not implemented yet")


if __name__ == "__main__":
    sys.exit(main())

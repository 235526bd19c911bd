"""The one error hierarchy of s4fs.

Every error s4fs raises on purpose derives from :class:`S4Error`, carries the errno the
FUSE layer reports for it, and also inherits the builtin exception a Python caller would
expect (``NotFound`` is a ``FileNotFoundError``). The mount maps errors to errno in one
place (``s4fs.mount``) by reading ``.errno`` — nothing else in s4fs knows about FUSE.

This module imports nothing from s4fs, so every layer (codec included) may use it.
"""

from __future__ import annotations

import errno as _errno


class S4Error(Exception):
    """Base class of every s4fs error. ``errno`` is what a FUSE caller sees."""

    errno: int = _errno.EIO

    def __init__(self, message: str, *args: object) -> None:
        super().__init__(message, *args)
        self.message = message

    def __str__(self) -> str:
        return self.message


# --- codec -------------------------------------------------------------------------

class CodecError(S4Error, ValueError):
    """A blob could not be encoded or decoded."""


class FormatError(CodecError):
    """The bytes are not an s4fs blob (wrong magic, truncated, inconsistent header)."""


class SpoolChanged(CodecError):
    """The bytes of a file being saved changed while its chunks were being coded (a
    rewrite the coder could not see in time): that coding is void and the file must be
    ingested again from its spool."""


class UnsupportedVersionError(CodecError):
    """The blob was written by a newer s4fs (or a codec this build does not know)."""


class ChecksumError(CodecError):
    """Decoded bytes do not match the checksum recorded when they were written."""


class BaseMismatchError(CodecError):
    """A delta blob was decoded against a base other than the one it was written with."""


class CodecUnavailableError(CodecError):
    """The codec a blob needs is not available on this machine (no CUDA, no nvCOMP)."""

    errno = _errno.EOPNOTSUPP


# --- core and stores ---------------------------------------------------------------

class NotFound(S4Error, FileNotFoundError):
    errno = _errno.ENOENT


class AlreadyExists(S4Error, FileExistsError):
    errno = _errno.EEXIST


class NotADirectory(S4Error, NotADirectoryError):
    errno = _errno.ENOTDIR


class IsADirectory(S4Error, IsADirectoryError):
    errno = _errno.EISDIR


class DirectoryNotEmpty(S4Error, OSError):
    errno = _errno.ENOTEMPTY


class PermissionDenied(S4Error, PermissionError):
    errno = _errno.EACCES


class InvalidArgument(S4Error, ValueError):
    errno = _errno.EINVAL


class Busy(S4Error, OSError):
    """A resource is in use, or a remote store kept throttling after every retry."""

    errno = _errno.EBUSY


class StoreUnavailable(S4Error, ConnectionError):
    """The store could not be reached after every retry."""

    errno = _errno.EIO


class StoreError(S4Error, OSError):
    """Any other store failure; the message carries the store's code and request id."""

    errno = _errno.EIO


class CorruptManifest(S4Error, ValueError):
    """A manifest could not be parsed or was written by an unknown format version."""

    errno = _errno.EIO


class NoSpace(S4Error, OSError):
    """The local cache disk (spool files) is full: the write was refused, nothing of this
    version is committed, and the previous version of the file stays."""

    errno = _errno.ENOSPC


class MissingData(S4Error, OSError):
    """An existing file's manifest names data (a pack) that is not in the store: the file
    cannot be read back. Never reported as "no such file"."""

    errno = _errno.EIO


class IsALink(S4Error, OSError):
    """The path names a symbolic link where a file or folder was needed (the caller
    did not follow it)."""
    errno = _errno.ELOOP


class NameTooLong(S4Error, OSError):
    """A name (one path component) is longer than NAME_MAX (255 bytes)."""

    errno = _errno.ENAMETOOLONG

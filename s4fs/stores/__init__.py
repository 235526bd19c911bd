"""Object stores: the ``Store`` ABC, ``LocalStore`` and (lazily) ``S3Store``."""

from __future__ import annotations

from .base import ObjectInfo, ObjectWriter, Store, check_key
from .local import LocalStore

__all__ = ["Store", "ObjectInfo", "ObjectWriter", "LocalStore", "check_key", "open_store"]


def open_store(url: str, **options) -> Store:
    """Open a store from a URL: a directory path, ``file://...`` or ``s3://bucket/prefix``."""
    if url.startswith("s3://"):
        from .s3 import S3Store
        return S3Store.from_url(url, **options)
    if url.startswith("file://"):
        from urllib.parse import unquote, urlparse
        url = unquote(urlparse(url).path)
    return LocalStore(url)

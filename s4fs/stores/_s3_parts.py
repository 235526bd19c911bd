"""Objects sent to S3 in parts, each with the MD5 of its body, while they are written.

:class:`PackWriter` is ``S3Store.writer``: the ingest writes a pack's coded chunks ahead
of its commit, and here they go to the bucket as they come, as the parts of one
multipart upload of at least :data:`PART` bytes each (S3 wants 5 MiB or more for every
part but the last). At the commit only what is left (less than a part) and the
completion are sent, so the tail of a save waits for that, not for a whole pack. A pack
that stays under one part is one ``PutObject`` at the commit.

Every body s4fs sends — each part, each put — carries ``Content-MD5``, which S3 and
every server the tests run on verify (Ceph RGW 16.2 ignores the newer
``x-amz-checksum-*`` headers): a body damaged on the way is refused (``BadDigest``),
never stored. Nothing is under the key until the upload completes; a failed or aborted
one is aborted on the server (a bucket lifecycle rule reclaims what an abort could not:
docs/S3.md).
"""

from __future__ import annotations

import base64
import hashlib
from typing import TYPE_CHECKING

from .base import ObjectWriter

if TYPE_CHECKING:
    from .s3 import S3Store

MiB = 1 << 20
PART = 8 * MiB                # a part of a pack written ahead (S3: >= 5 MiB but the last)


def content_md5(body) -> str:
    """The ``Content-MD5`` header of ``body``: its MD5, base64."""
    return base64.b64encode(hashlib.md5(body).digest()).decode("ascii")


class Upload:
    """One multipart upload of ``store``'s object ``key`` (its full S3 key ``full``),
    started at the first part."""

    def __init__(self, store: "S3Store", key: str, full: str) -> None:
        self._store, self._key, self._full = store, key, full
        self._id: str | None = None
        self._parts: list[dict] = []

    @property
    def started(self) -> bool:
        return self._id is not None

    def send(self, body) -> None:
        """The next part."""
        s, client = self._store, self._store._client
        if self._id is None:
            self._id = s._call("put", self._key, lambda: client.create_multipart_upload(
                Bucket=s.bucket, Key=self._full, **s._put_args)["UploadId"])
        number, md5 = len(self._parts) + 1, content_md5(body)
        response = s._call("put", self._key, lambda: client.upload_part(
            Bucket=s.bucket, Key=self._full, UploadId=self._id, PartNumber=number,
            Body=body, ContentMD5=md5))
        part = {"PartNumber": number, "ETag": response["ETag"]}
        part.update({k: v for k, v in response.items() if k.startswith("Checksum")
                     and k != "ChecksumType"})
        self._parts.append(part)

    def complete(self) -> None:
        s = self._store
        s._call("put", self._key, lambda: s._client.complete_multipart_upload(
            Bucket=s.bucket, Key=self._full, UploadId=self._id,
            MultipartUpload={"Parts": self._parts}))
        self._id = None

    def abort(self) -> None:
        """Best effort: the parts sent so far are dropped on the server."""
        if self._id is not None:
            upload_id, self._id = self._id, None
            try:
                self._store._client.abort_multipart_upload(
                    Bucket=self._store.bucket, Key=self._full, UploadId=upload_id)
            except Exception:
                pass                          # the lifecycle rule reclaims it


class PackWriter(ObjectWriter):
    """``S3Store.writer``: the pieces written are sent as parts of ``part`` bytes or
    more as soon as that many are buffered; the rest at the commit."""

    def __init__(self, store: "S3Store", key: str, full: str, part: int = PART) -> None:
        super().__init__(store, key)
        self._upload = Upload(store, key, full)
        self._part = part
        self._buffered = 0

    def write(self, parts: list) -> None:
        for p in parts:
            self._parts.append(p)
            self._buffered += memoryview(p).nbytes
        if self._buffered >= self._part:
            self._upload.send(self._take())

    def _take(self) -> bytes:
        body = b"".join(self._parts)
        self._parts, self._buffered = [], 0
        return body

    def commit(self) -> None:
        body = self._take()
        if not self._upload.started:
            self.store.put(self.key, body)
            return
        try:
            if body:
                self._upload.send(body)
            self._upload.complete()
        except BaseException:
            self._upload.abort()
            raise

    def abort(self) -> None:
        self._parts, self._buffered = [], 0
        self._upload.abort()

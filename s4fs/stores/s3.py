"""S3Store: objects in an S3 bucket (or any S3-compatible endpoint) under a prefix.

``s3://bucket/prefix`` names the store; store keys are relative to the prefix, so the
object of key ``chunks/ab/cd`` lives at ``s3://bucket/prefix/chunks/ab/cd``.

This module is the store's edge: every S3 failure is translated here, from S3 error
codes and HTTP statuses (never from message text), into the typed errors of
:mod:`s4fs.errors`, with the S3 request id kept in the message. Throttling, 5xx and
connection failures are retried here, in one place (:meth:`S3Store._call`), with
exponential backoff and full jitter inside a budget of attempts and seconds; botocore's
own retries are turned off so the two never multiply.

boto3 (botocore, its core) is imported lazily, on the first ``S3Store`` construction:
``import s4fs`` works on a machine without it.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterator, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from s4fs.errors import (Busy, InvalidArgument, NotFound, PermissionDenied, S4Error,
                         StoreError, StoreUnavailable)

from ._s3_parts import PackWriter, Upload, content_md5
from .base import NameTooLong, ObjectInfo, ObjectWriter, Store, check_key

S3_KEY_MAX = 1024            # bytes of UTF-8 in an S3 object key

T = TypeVar("T")
MiB = 1 << 20

SSE_MODES = ("AES256", "aws:kms")

# S3 error codes (the <Code> of an error response; HEAD responses carry no body, so
# botocore reports the HTTP status as the code there).
_NOT_FOUND = frozenset({"NoSuchKey", "NotFound", "404"})
_DENIED = frozenset({"AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId",
                     "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                     "AccountProblem", "InvalidSecurity"})
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException",
                        "ThrottledException", "RequestThrottled",
                        "RequestThrottledException", "TooManyRequestsException",
                        "RequestLimitExceeded", "BandwidthLimitExceeded",
                        "ProvisionedThroughputExceededException", "ServiceUnavailable",
                        "503", "429"})
_TRANSIENT = frozenset({"InternalError", "InternalServerError", "RequestTimeout",
                        "RequestTimeoutException", "OperationAborted", "BadGateway",
                        "GatewayTimeout", "500", "502", "504",
                        # a body damaged on the way (its Content-MD5 or signed hash does
                        # not match): the server stored nothing; send it again
                        "BadDigest", "XAmzContentSHA256Mismatch"})
_THROTTLED_STATUS = frozenset({429, 503})
_TRANSIENT_STATUS = frozenset({500, 502, 504})

# kinds of failure
_THROTTLE, _TRANSIENT_KIND, _FINAL = "throttle", "transient", "final"


@dataclass(frozen=True)
class S3Options:
    """Everything an ``S3Store`` can be told besides bucket and prefix.

    Region, profile and credentials default to boto3's standard chain (environment,
    shared config/credentials files, SSO, container and instance roles).

    Timeouts and retries. The defaults fail a call — and so a save — within about a
    minute of a store that stopped answering, and still ride out throttling:

    * ``connect_timeout`` (5 s) bounds opening a connection and, because urllib3 sends
      the request under it, any stall while the body is being sent: it is an idle limit
      per block of 16 KiB, not a limit on the whole upload, so a 32 MiB pack on a slow
      link is fine as long as bytes keep moving.
    * ``read_timeout`` (20 s) bounds each wait for the answer once the request is
      sent. It also covers the tail of an upload still draining from the kernel's send
      buffer (at most 4 MiB on Linux: about 17 s at 2 Mbit/s), plus the store's own time
      to acknowledge a put.
    * Throttling, 5xx, dropped connections and timeouts are retried with exponential
      backoff and full jitter (``backoff_base`` 0.1 s doubled per retry, at most
      ``backoff_max`` 10 s) up to ``max_attempts`` (10) tries, and no retry starts after
      ``retry_seconds`` (30 s) of the call. The attempt in flight at that moment is not
      cut short, so a call against a silent endpoint gives up after at most
      ``retry_seconds + connect_timeout + read_timeout`` plus about one second (botocore
      waits up to 1 s for ``100 Continue`` before sending a put's body): about 56 s.
      An unreachable endpoint (connection refused) fails within ``retry_seconds``.
    * A single attempt that keeps making progress (a large upload on a slow link) is
      never interrupted: the timeouts are idle limits.
    """

    endpoint_url: str | None = None       # any S3-compatible endpoint; None = AWS
    region: str | None = None
    profile: str | None = None
    sse: str | None = None                # "AES256" (SSE-S3) or "aws:kms" (SSE-KMS)
    kms_key_id: str | None = None         # implies sse="aws:kms"
    addressing_style: str | None = None   # "path", "virtual" or None (botocore's choice)
    # retry budget of one store call: whichever of attempts and seconds runs out first
    max_attempts: int = 10                # tries per call, the first one included
    retry_seconds: float = 30.0           # no retry starts later than this into a call
    backoff_base: float = 0.1             # first backoff ceiling, doubled per retry
    backoff_max: float = 10.0             # largest backoff ceiling
    connect_timeout: float = 5.0          # idle limit: connecting, sending the request
    read_timeout: float = 20.0            # idle limit: waiting for and reading the answer
    max_pool_connections: int = 32        # the ingest pipeline puts from a thread pool
    multipart_threshold: int = 64 * MiB   # puts larger than this use multipart upload
    part_size: int = 16 * MiB             # S3 needs >= 5 MiB for every part but the last
    list_page_size: int = 1000            # keys per ListObjectsV2 page (S3's maximum)

    def __post_init__(self) -> None:
        if self.sse is not None and self.sse not in SSE_MODES:
            raise InvalidArgument(f"sse={self.sse!r} is not supported: use one of "
                                  f"{', '.join(SSE_MODES)} (or leave it unset)")
        if self.kms_key_id and self.sse not in (None, "aws:kms"):
            raise InvalidArgument("kms_key_id needs sse='aws:kms'")
        if self.addressing_style not in (None, "auto", "path", "virtual"):
            raise InvalidArgument(f"addressing_style={self.addressing_style!r}: "
                                  "use 'path', 'virtual' or 'auto'")
        if self.max_attempts < 1 or self.retry_seconds < 0:
            raise InvalidArgument("max_attempts must be >= 1 and retry_seconds >= 0")
        if self.backoff_base < 0 or self.backoff_max < 0:
            raise InvalidArgument("backoff_base and backoff_max must be >= 0")
        if not (self.connect_timeout > 0 and self.read_timeout > 0):
            raise InvalidArgument("connect_timeout and read_timeout must be > 0 seconds")
        if self.part_size < 1 or self.multipart_threshold < 1 or self.list_page_size < 1:
            raise InvalidArgument("part_size, multipart_threshold and list_page_size "
                                  "must be positive")
        if self.max_pool_connections < 1:
            raise InvalidArgument("max_pool_connections must be >= 1")

    @classmethod
    def from_strings(cls, values: dict[str, str]) -> S3Options:
        """Options from text (URL query parameters), converted to each field's type."""
        known = {f.name: f for f in fields(cls)}
        out: dict[str, object] = {}
        for name, text in values.items():
            if name not in known:
                raise InvalidArgument(f"unknown S3 store option {name!r}; known: "
                                      f"{', '.join(sorted(known))}")
            kind = type(known[name].default)
            try:
                out[name] = kind(text) if kind in (int, float) else text
            except ValueError:
                raise InvalidArgument(f"S3 store option {name}={text!r} is not "
                                      f"a{'n' if kind is int else ''} {kind.__name__}") from None
        return cls(**out)

    def put_args(self) -> dict[str, str]:
        """Server-side encryption arguments for PutObject and CreateMultipartUpload."""
        sse = "aws:kms" if self.kms_key_id else self.sse
        args = {"ServerSideEncryption": sse} if sse else {}
        if self.kms_key_id:
            args["SSEKMSKeyId"] = self.kms_key_id
        return args


@dataclass(frozen=True)
class _Failure:
    """One failed S3 request, as read from the exception botocore raised."""
    kind: str                 # _THROTTLE, _TRANSIENT_KIND or _FINAL
    code: str
    status: int | None
    request_id: str
    host_id: str
    detail: str

    def ids(self) -> str:
        parts = [f"HTTP {self.status}" if self.status else "no HTTP response"]
        if self.request_id:
            parts.append(f"request id {self.request_id}")
        if self.host_id:
            parts.append(f"host id {self.host_id}")
        return "; ".join(parts)


_loader_lock = threading.Lock()
_loader = None            # botocore's service-model loader, shared: loading costs ~0.4 s


_STREAM_PIECE = 1 << 20     # bytes of a body read at a time by get_into


def _botocore_session(profile: str | None):
    """A fresh botocore session (its own credential chain) on the shared model loader."""
    global _loader
    import botocore.session
    session = botocore.session.Session()
    if profile:
        session.set_config_variable("profile", profile)
    with _loader_lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return session


def _client_error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _classify(exc: BaseException) -> _Failure | None:
    """What kind of failure ``exc`` is, or None when it is not an S3/transport error."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        response = exc.response or {}
        error = response.get("Error", {})
        meta = response.get("ResponseMetadata", {})
        code = str(error.get("Code", ""))
        status = meta.get("HTTPStatusCode")
        if code in _THROTTLED or (code not in _TRANSIENT and status in _THROTTLED_STATUS):
            kind = _THROTTLE
        elif code in _TRANSIENT or status in _TRANSIENT_STATUS:
            kind = _TRANSIENT_KIND
        else:
            kind = _FINAL
        return _Failure(kind, code or str(status), status,
                        str(meta.get("RequestId") or error.get("RequestId") or ""),
                        str(meta.get("HostId") or error.get("HostId") or ""),
                        str(error.get("Message", "")))
    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError)):
        return _Failure(_TRANSIENT_KIND, type(exc).__name__, None, "", "", str(exc))
    if isinstance(exc, bx.BotoCoreError):
        return _Failure(_FINAL, type(exc).__name__, None, "", "", str(exc))
    if isinstance(exc, OSError):          # a socket error that escaped botocore's wrapping
        return _Failure(_TRANSIENT_KIND, type(exc).__name__, None, "", "", str(exc))
    return None


def _new_client(opts: S3Options, url: str):
    """A botocore S3 client for ``opts`` (``url`` names the store in errors)."""
    try:
        from botocore import exceptions as bx
        from botocore.config import Config
    except ImportError as exc:
        raise StoreError("S3 stores need boto3, which is not installed here: "
                         "pip install 's4fs[s3]' (or pip install boto3)") from exc
    s3_config = {"addressing_style": opts.addressing_style} if opts.addressing_style else {}
    config = Config(
        region_name=opts.region,
        max_pool_connections=opts.max_pool_connections,
        connect_timeout=opts.connect_timeout,
        read_timeout=opts.read_timeout,
        # one try per botocore call: S3Store._call is the only place that retries
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3=s3_config or None,
        user_agent_extra="s4fs",
    )
    try:
        session = _botocore_session(opts.profile)
        client = session.create_client("s3", region_name=opts.region,
                                       endpoint_url=opts.endpoint_url, config=config)
    except bx.ProfileNotFound as exc:
        raise InvalidArgument(f"AWS profile {opts.profile!r} not found: {exc}") from None
    except (bx.BotoCoreError, ValueError) as exc:
        raise InvalidArgument(f"cannot configure an S3 client for {url}: {exc}") from None
    return client


class S3Store(Store):
    """A store in ``s3://bucket/prefix``. Safe to share between threads (one client)."""

    def __init__(self, bucket: str, prefix: str = "", options: S3Options | None = None,
                 **overrides) -> None:
        self._setup(bucket, prefix, options, overrides)
        # made here, so that a wrong option or profile is an error at once; in a worker
        # process, where the store comes by pickle, at its first request (_in_worker)
        self._client_now = self._make_client()

    def _setup(self, bucket: str, prefix: str, options: S3Options | None,
               overrides: dict) -> None:
        if not bucket or "/" in bucket:
            raise InvalidArgument(f"invalid S3 bucket name {bucket!r}")
        options = options or S3Options()
        if overrides:
            try:
                options = replace(options, **overrides)
            except TypeError as exc:
                raise InvalidArgument(f"unknown S3 store option: {exc}") from None
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        self.bucket = bucket
        self.prefix = prefix
        self.options = options
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._root = prefix + "/" if prefix else ""
        self._put_args = options.put_args()
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "retries": 0, "bytes_sent": 0, "bytes_received": 0}
        # whether this server compares If-Match with the ETag unquoted (Ceph RGW 16: the
        # quoted ETag its GET returns is refused); learnt at the first replace
        self._bare_if_match = False
        self._client_lock = threading.Lock()
        self._client_now = None

    @property
    def _client(self):
        client = self._client_now
        if client is None:
            with self._client_lock:
                if self._client_now is None:
                    self._client_now = self._make_client()
                client = self._client_now
        return client

    @classmethod
    def from_url(cls, url: str, **options) -> S3Store:
        """``s3://bucket[/prefix][?option=value&...]``; keyword options win over the
        query string. Options are the fields of :class:`S3Options`."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise InvalidArgument(f"not an S3 URL: {url!r} (expected s3://bucket/prefix)")
        base = S3Options.from_strings(dict(parse_qsl(parts.query, keep_blank_values=True)))
        return cls(parts.netloc, unquote(parts.path), base, **options)

    def __reduce__(self):
        # worker processes (s4fs.coding) get the store by pickle and make their own client
        return (_in_worker, (self.bucket, self.prefix, self.options))

    def __repr__(self) -> str:
        where = f" at {self.options.endpoint_url}" if self.options.endpoint_url else ""
        return f"S3Store({self.url!r}{where})"

    # --- client ------------------------------------------------------------------

    def _make_client(self):
        client = _new_client(self.options, self.url)
        client.meta.events.register("before-send.s3", self._count_request)
        return client

    def _count_request(self, request=None, **_) -> None:
        try:
            sent = int(request.headers.get("Content-Length") or 0)
        except (AttributeError, TypeError, ValueError):
            sent = 0
        with self._lock:
            self._stats["requests"] += 1
            self._stats["bytes_sent"] += sent

    def stats(self) -> dict[str, int]:
        """HTTP requests sent (retries included), retries, request body bytes sent and
        object bytes received since this store was opened."""
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        if self._client_now is not None:
            self._client_now.close()

    # --- the one place that retries and translates errors ------------------------

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        opts = self.options
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except S4Error:
                raise
            except Exception as exc:
                failure = _classify(exc)
                if failure is None:
                    raise
                elapsed = time.monotonic() - started
                if failure.kind != _FINAL and attempt < opts.max_attempts:
                    ceiling = min(opts.backoff_max, opts.backoff_base * 2.0 ** min(attempt - 1, 64))
                    delay = random.uniform(0, ceiling)          # full jitter
                    if elapsed + delay <= opts.retry_seconds:
                        with self._lock:
                            self._stats["retries"] += 1
                        time.sleep(delay)
                        continue
                raise self._error(op, key, failure, attempt, elapsed) from exc

    def _error(self, op: str, key: str, f: _Failure, attempts: int,
               elapsed: float) -> S4Error:
        where = f"s3://{self.bucket}/{self._root}{key}" if key else self.url
        what = f"S3 {op} of {where}: {f.code} ({f.ids()})"
        if f.detail:
            what += f": {f.detail}"
        tried = f"gave up after {attempts} attempt{'s' if attempts > 1 else ''} in {elapsed:.1f} s"
        if f.kind == _THROTTLE:
            return Busy(f"{what}; S3 kept throttling, {tried}. Lower the number of "
                        "parallel uploads, or raise max_attempts/retry_seconds.")
        if f.kind == _TRANSIENT_KIND:
            endpoint = self.options.endpoint_url or "AWS S3"
            if f.code in ("ConnectTimeoutError", "ReadTimeoutError"):
                tried += (f" (no answer within connect_timeout="
                          f"{self.options.connect_timeout:g} s / read_timeout="
                          f"{self.options.read_timeout:g} s)")
            return StoreUnavailable(f"{what}; {tried}. Check the network and that "
                                    f"{endpoint} is reachable and healthy.")
        if f.code == "NoSuchBucket":
            return StoreError(f"{what}. Bucket {self.bucket!r} does not exist: create it, "
                              "or fix the bucket name or endpoint_url.")
        if f.code in _NOT_FOUND or (f.status == 404 and f.code != "NoSuchUpload"):
            return NotFound(f"no object {key!r} in {self.url} ({f.ids()})")
        if f.code in _DENIED or f.status == 403:
            return PermissionDenied(f"{what}. Check the credentials, and that the IAM "
                                    "policy allows this action on the bucket and prefix "
                                    "(and kms:GenerateDataKey/kms:Decrypt with SSE-KMS); "
                                    "see docs/S3.md.")
        if f.code in ("NoCredentialsError", "PartialCredentialsError",
                      "CredentialRetrievalError"):
            return PermissionDenied(f"{what}. No usable AWS credentials: set "
                                    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, "
                                    "or an instance/container role.")
        if f.code == "RequestTimeTooSkewed":
            return StoreError(f"{what}. This machine's clock is too far from S3's: "
                              "synchronise it (NTP, chrony) and retry.")
        if f.code == "ParamValidationError":
            return InvalidArgument(what)
        if f.code in ("InvalidRequest", "InvalidArgument", "NotImplemented") and \
                op == "put" and self._put_args:
            asked = ", ".join(f"{k}={v}" for k, v in self._put_args.items())
            return StoreError(f"{what}. The server refused the request with server-side "
                              f"encryption ({asked}): it may not support it or not be "
                              "set up for it (a KMS; Ceph RGW also wants HTTPS). Ask its "
                              "operator, or leave out sse/kms_key_id; see docs/S3.md.")
        return StoreError(what)

    # --- Store -------------------------------------------------------------------

    def _key(self, key: str) -> str:
        full = self._root + check_key(key)
        if len(full.encode("utf-8", "surrogateescape")) > S3_KEY_MAX:
            raise NameTooLong(f"the path {key!r} makes an S3 key longer than {S3_KEY_MAX} "
                              f"bytes (with the prefix {self._root!r}); use shorter names "
                              f"or a shorter prefix")
        return full

    def _get_args(self, key, start, end) -> tuple[dict, bool]:
        if (start is not None and start < 0) or (end is not None and end < 0):
            raise InvalidArgument(f"negative byte range [{start}, {end}) for {key!r}")
        lo = start or 0
        ranged = lo > 0 or end is not None
        args = {"Bucket": self.bucket, "Key": self._key(key)}
        if ranged:
            args["Range"] = f"bytes={lo}-" + ("" if end is None else str(end - 1))
        return args, ranged

    def _open(self, args: dict, ranged: bool):
        """The GetObject response for ``args``, or None: the object exists and the range
        starts past its end."""
        from botocore.exceptions import ClientError
        try:
            return self._client.get_object(**args)
        except ClientError as exc:
            if ranged and _client_error_code(exc) == "InvalidRange":
                return None
            raise

    def get(self, key, start=None, end=None) -> bytes:
        args, ranged = self._get_args(key, start, end)
        lo = start or 0
        if end is not None and end <= lo:
            self.head(key)                  # an empty range of a missing key is NotFound
            return b""

        def fetch() -> bytes:
            response = self._open(args, ranged)
            if response is None:
                return b""
            body = response["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            if ranged and "ContentRange" not in response:
                data = data[lo:end]          # a server that ignored the Range header
            return data

        data = self._call("get", key, fetch)
        with self._lock:
            self._stats["bytes_received"] += len(data)
        return data

    def get_into(self, key, start: int, end: int, out) -> int:
        """As ``get``, but the body streams into ``out`` a MiB at a time, so a large
        read (a fetch ahead of a cold file's decode) holds no second copy of it."""
        mv = memoryview(out).cast("B")[: max(0, end - start)]
        if end <= start:
            self.head(key)
            return 0
        args, ranged = self._get_args(key, start, end)

        def fetch() -> int:
            response = self._open(args, ranged)
            if response is None:
                return 0
            body = response["Body"]
            try:
                if ranged and "ContentRange" not in response:
                    data = body.read()[start:end]     # a server that ignored the Range
                    mv[: len(data)] = data
                    return len(data)
                got = 0
                while got < len(mv):
                    piece = body.read(min(_STREAM_PIECE, len(mv) - got))
                    if not piece:
                        break
                    mv[got: got + len(piece)] = piece
                    got += len(piece)
                return got
            finally:
                body.close()

        got = self._call("get", key, fetch)
        with self._lock:
            self._stats["bytes_received"] += got
        return got

    def put(self, key, data) -> None:
        full = self._key(key)
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else None
        size = len(data) if view is None else view.nbytes
        if size > self.options.multipart_threshold:
            self._put_multipart(key, full, view if view is not None else memoryview(data))
            return
        body = data if view is None else view.tobytes()
        md5 = content_md5(body)
        self._call("put", key, lambda: self._client.put_object(
            Bucket=self.bucket, Key=full, Body=body, ContentMD5=md5, **self._put_args))

    def writer(self, key) -> ObjectWriter:
        """A pack sent as the parts of a multipart upload while it fills (s4fs.stores.
        _s3_parts), each part with its MD5 for the server to check."""
        return PackWriter(self, key, self._key(key))

    def replace(self, key, data, expected: bytes) -> bool:
        """S3's conditional write: the object is read with its ETag and put back with
        ``If-Match`` that ETag, so the server refuses it (412) when anything changed
        the object in between. (Manifests are small: one PutObject, never multipart.)

        Some servers compare ``If-Match`` with the ETag unquoted, and refuse the quoted
        one their own GET returned as if the object had changed (Ceph RGW 16.2). Where a
        put is refused while the object's ETag is still the one read, the put is made
        once more with it unquoted; where that is taken, this store sends it unquoted
        from then on (docs/S3.md)."""
        from botocore.exceptions import ClientError
        full = self._key(key)

        def fetch():
            response = self._client.get_object(Bucket=self.bucket, Key=full)
            body = response["Body"]
            try:
                return body.read(), response["ETag"]
            finally:
                body.close()
        try:
            current, etag = self._call("get", key, fetch)
        except NotFound:
            return False
        if current != expected:
            return False
        body = bytes(data)

        def put(tag: str) -> bool:
            try:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=body,
                                        ContentMD5=content_md5(body), IfMatch=tag,
                                        **self._put_args)
                return True
            except ClientError as exc:
                if _client_error_code(exc) in ("PreconditionFailed",
                                               "ConditionalRequestConflict", "NoSuchKey"):
                    return False
                raise
        bare = etag.strip('"')
        if self._call("put", key, lambda: put(bare if self._bare_if_match else etag)):
            return True
        if self._bare_if_match or bare == etag:
            return False
        try:                                  # refused: changed, or a bare-ETag server?
            now = self._call("head", key, lambda: self._client.head_object(
                Bucket=self.bucket, Key=full))["ETag"]
        except NotFound:
            return False
        if now != etag or not self._call("put", key, lambda: put(bare)):
            return False
        self._bare_if_match = True
        return True

    def _put_multipart(self, key: str, full: str, view: memoryview) -> None:
        """Upload in parts; the object appears only when the upload completes, and a
        failed upload is aborted so no parts linger (best effort: also set a bucket
        lifecycle rule, see docs/S3.md)."""
        upload = Upload(self, key, full)
        try:
            # S3: parts of at least 5 MiB (but the last), at most 10,000 of them
            step = max(self.options.part_size, 5 * MiB, -(-view.nbytes // 10_000))
            for offset in range(0, view.nbytes, step):
                upload.send(view[offset:offset + step].tobytes())
            upload.complete()
        except BaseException:
            upload.abort()
            raise

    def delete(self, key) -> None:
        full = self._key(key)
        try:
            self._call("delete", key, lambda: self._client.delete_object(
                Bucket=self.bucket, Key=full))
        except NotFound:
            pass                              # some S3-compatible servers answer 404

    def head(self, key) -> ObjectInfo:
        full = self._key(key)
        response = self._call("head", key, lambda: self._client.head_object(
            Bucket=self.bucket, Key=full))
        return ObjectInfo(key, int(response["ContentLength"]),
                          response["LastModified"].timestamp())

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if not isinstance(prefix, str) or prefix.startswith("/") or "\x00" in prefix:
            raise InvalidArgument(f"invalid store prefix {prefix!r}")
        first = self._list_page(prefix, None)    # errors surface at the call, not later
        return self._list_rest(prefix, first)

    def _list_page(self, prefix: str, token: str | None) -> dict:
        args = {"Bucket": self.bucket, "Prefix": self._root + prefix,
                "MaxKeys": self.options.list_page_size}
        if token:
            args["ContinuationToken"] = token
        return self._call("list", prefix, lambda: self._client.list_objects_v2(**args))

    def _list_rest(self, prefix: str, page: dict) -> Iterator[ObjectInfo]:
        cut = len(self._root)
        while True:
            for item in page.get("Contents", ()):
                key = item["Key"][cut:]
                if key:                       # skip a "folder" marker at the prefix itself
                    yield ObjectInfo(key, int(item["Size"]),
                                     item["LastModified"].timestamp())
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            page = self._list_page(prefix, token)


def _in_worker(bucket: str, prefix: str, options: S3Options) -> S3Store:
    """An S3Store unpickled in a worker process (s4fs.coding): its client is made at its
    first request. Making one loads botocore's service model, about 0.3 s of one core on
    a small machine, and a worker that decodes a fresh node's batches from bytes fetched
    ahead (s4fs.read.fetch) never sends one: two workers making theirs doubled the CPU a
    2-core node spent on a restore beside what boto3's own download spends."""
    store = S3Store.__new__(S3Store)
    store._setup(bucket, prefix, options, {})
    return store

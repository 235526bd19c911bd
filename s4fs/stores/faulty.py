"""FailingStore: a store wrapper that raises chosen errors on chosen calls.

Faults are injected by wrapping a store, never by patching internals. Tests use it to
prove what the user sees when the store fails: a save whose chunk or manifest put fails
makes ``close()`` fail, and nothing half-written becomes visible::

    store = FailingStore(LocalStore(tmp), fail_on={"put"}, key_prefix="chunks/",
                         after=3, error=StoreUnavailable)

fails every chunk put after the first three with ``StoreUnavailable``. Calls that do
not fail pass straight through to the wrapped store.
"""

from __future__ import annotations

import copy
import threading
from typing import Callable, Iterable, Iterator, Mapping, Union

from s4fs.errors import InvalidArgument, StoreUnavailable

from .base import ObjectInfo, ObjectWriter, Store

#: ``write``: a piece of an object written ahead (``Store.writer``); its commit is a ``put``
OPERATIONS = ("get", "put", "delete", "list", "head", "replace", "write")

#: an exception class, an exception instance (copied on every raise), or a callable
#: ``(op, key) -> exception``
ErrorSpec = Union[type, BaseException, Callable[[str, str], BaseException]]


class FailingStore(Store):
    """Wrap ``inner``; fail the calls named in ``fail_on``.

    * ``fail_on``: operation names (``get``, ``put``, ``delete``, ``list``, ``head``,
      ``replace``, ``write`` — a piece written ahead; a writer's commit is a ``put``),
      or a mapping of operation name to the error for that operation (``None`` means
      ``error``).
    * ``times``: how many calls of each operation fail before that operation works
      again; ``None`` fails them all.
    * ``after``: how many matching calls of each operation succeed before failures
      start (to fail in the middle of a save rather than at its first put).
    * ``error``: what is raised (see ``ErrorSpec``); default ``StoreUnavailable``.
    * ``key_prefix``: only keys (for ``list``: prefixes) starting with it fail.
    * ``applied``: when true, a failing ``put``/``delete`` reaches the inner store
      first, then raises — the write happened but the caller was told it failed.

    ``failures`` counts the errors raised per operation; ``disarm()`` stops failing.
    """

    def __init__(self, inner: Store, fail_on: Iterable[str] | Mapping[str, ErrorSpec | None],
                 times: int | None = None, error: ErrorSpec = StoreUnavailable,
                 key_prefix: str = "", after: int = 0, applied: bool = False) -> None:
        specs = dict(fail_on) if isinstance(fail_on, Mapping) else dict.fromkeys(fail_on)
        unknown = set(specs) - set(OPERATIONS)
        if unknown:
            raise InvalidArgument(f"FailingStore cannot fail {sorted(unknown)}; "
                                  f"operations are {', '.join(OPERATIONS)}")
        if (times is not None and times < 0) or after < 0:
            raise InvalidArgument("times and after must be >= 0")
        self.inner = inner
        self.url = inner.url
        self._errors = {op: (error if spec is None else spec) for op, spec in specs.items()}
        self._times = times
        self._after = after
        self._prefix = key_prefix
        self._applied = applied
        self._lock = threading.Lock()
        self._seen = dict.fromkeys(OPERATIONS, 0)
        self.failures = dict.fromkeys(OPERATIONS, 0)
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def __repr__(self) -> str:
        return f"FailingStore({self.inner!r}, fail_on={sorted(self._errors)})"

    def _should_fail(self, op: str, key: str) -> bool:
        if op not in self._errors or not key.startswith(self._prefix):
            return False
        with self._lock:
            if not self.armed:
                return False
            self._seen[op] += 1
            if self._seen[op] <= self._after:
                return False
            if self._times is not None and self.failures[op] >= self._times:
                return False
            self.failures[op] += 1
            return True

    def _error(self, op: str, key: str) -> BaseException:
        spec = self._errors[op]
        if isinstance(spec, BaseException):
            return copy.copy(spec)           # one instance per raise: threads share spec
        if isinstance(spec, type) and issubclass(spec, BaseException):
            return spec(f"injected failure: {op} {key!r} in {self.url}")
        return spec(op, key)

    def get(self, key, start=None, end=None) -> bytes:
        if self._should_fail("get", key):
            raise self._error("get", key)
        return self.inner.get(key, start, end)

    def put(self, key, data) -> None:
        if self._should_fail("put", key):
            if self._applied:
                self.inner.put(key, data)
            raise self._error("put", key)
        self.inner.put(key, data)

    def writer(self, key) -> ObjectWriter:
        return _FailingWriter(self, key, self.inner.writer(key))

    def replace(self, key, data, expected: bytes) -> bool:
        if self._should_fail("replace", key):
            if self._applied:
                self.inner.replace(key, data, expected)
            raise self._error("replace", key)
        return self.inner.replace(key, data, expected)

    def delete(self, key) -> None:
        if self._should_fail("delete", key):
            if self._applied:
                self.inner.delete(key)
            raise self._error("delete", key)
        self.inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if self._should_fail("list", prefix):
            raise self._error("list", prefix)
        return self.inner.list(prefix)

    def head(self, key) -> ObjectInfo:
        if self._should_fail("head", key):
            raise self._error("head", key)
        return self.inner.head(key)

    def close(self) -> None:
        self.inner.close()


class _FailingWriter(ObjectWriter):
    """The inner store's writer (so its own way of writing ahead is what runs), with
    the wrapper's faults: ``write`` on each piece, ``put`` at the commit."""

    def __init__(self, outer: FailingStore, key: str, inner: ObjectWriter) -> None:
        super().__init__(outer, key)
        self.outer, self.inner = outer, inner

    def write(self, parts: list) -> None:
        if self.outer._should_fail("write", self.key):
            self.inner.abort()
            raise self.outer._error("write", self.key)
        self.inner.write(parts)

    def commit(self) -> None:
        if self.outer._should_fail("put", self.key):
            if self.outer._applied:
                self.inner.commit()
            else:
                self.inner.abort()
            raise self.outer._error("put", self.key)
        self.inner.commit()

    def abort(self) -> None:
        self.inner.abort()

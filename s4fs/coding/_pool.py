"""The one interface of a coding pool."""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future

KEEP = "this version was not stored and the previous one stays"


class CodingPool(ABC):
    """Where batches of chunks are coded (and a cold file's chunks decoded ahead).

    Contract:

    * :meth:`submit` starts one batch and returns at once with a Future; a process pool
      takes a :class:`~s4fs.coding.Job` (its result a :class:`~s4fs.coding.JobResult`,
      the batch's pack already put in the store), the in-process pool a
      :class:`~s4fs.coding.ChunkBatch` (its result a tuple of per-chunk results, packed
      by the caller);
    * :meth:`submit_decode` does the same for a :class:`~s4fs.coding.DecodeJob` (chunks
      fetched, decoded, checked and written at their offsets; its result the number of
      chunks); a pool that cannot decode ahead raises ``NotImplementedError``;
    * :meth:`result` waits for a Future of this pool and returns its value, or raises
      the batch's error; :class:`~s4fs.coding.WorkerDied` when the process under it
      ended (``what``, ``doing`` and ``then`` word that message); the next submit then
      starts afresh;
    * ``max_in_flight``: how many batches one session keeps submitted before it waits;
    * :meth:`close` waits for the batches running and stops the pool's workers (a pool
      shared by a filesystem's sessions is closed by its :class:`~s4fs.coding.Pools`,
      not by one session).
    """

    max_in_flight: int = 1

    @abstractmethod
    def submit(self, job) -> Future: ...

    def submit_decode(self, job) -> Future:
        raise NotImplementedError(f"{type(self).__name__} does not decode ahead")

    @abstractmethod
    def result(self, fut: Future, what: str, *, doing: str = "coding",
               then: str = KEEP): ...

    def warm(self) -> list[int]:
        """Start the workers now (a save should not wait for them); their pids."""
        return self.pids()

    def pids(self) -> list[int]:
        """The pids of the pool's worker processes (none for threads)."""
        return []

    @abstractmethod
    def close(self) -> None: ...

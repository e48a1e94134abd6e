"""`InMemoryVectorIndex`: the `VectorIndex` port in a dict (unit tests, and the same quantised scoring as DynamoDB)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from om_lib import vectors as vec
from om_lib.ports import VectorEntry, VectorHit


class InMemoryVectorIndex:
    """Vectors per (resource, thread, space): `(through, [PackedVector])` batches, searched exactly."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # resource -> thread -> space -> list of (first seq, through, entries)
        self._data: dict[str, dict[str, dict[str, list[tuple[int, int, list[vec.PackedVector]]]]]] = {}

    def indexed_through(self, resource_id: str, thread_id: str, *, space: str) -> int:
        with self._lock:
            batches = self._data.get(resource_id, {}).get(thread_id, {}).get(space, [])
            return max((through for _, through, _ in batches), default=0)

    def add(
        self, resource_id: str, thread_id: str, entries: Sequence[VectorEntry], *, through_seq: int, space: str
    ) -> bool:
        packed = [vec.quantise(e.message_id, e.seq, e.vector) for e in sorted(entries, key=lambda e: e.seq)]
        first = packed[0].seq if packed else through_seq
        with self._lock:
            batches = self._data.setdefault(resource_id, {}).setdefault(thread_id, {}).setdefault(space, [])
            if any(start == first for start, _, _ in batches):
                return False
            batches.append((first, through_seq, packed))
            return True

    def search(
        self, resource_id: str, query: Sequence[float], *, space: str, top_k: int, thread_id: str | None = None
    ) -> list[VectorHit]:
        with self._lock:
            threads = self._data.get(resource_id, {})
            candidates = [
                (thread, entry)
                for thread, spaces in threads.items()
                if thread_id is None or thread == thread_id
                for _, _, entries in spaces.get(space, [])
                for entry in entries
            ]
        return [VectorHit(t, e.message_id, e.seq, s) for s, t, e in vec.top_k(query, candidates, top_k)]

    def delete_messages(
        self,
        resource_id: str,
        thread_id: str,
        message_ids: Sequence[str] | None,
        *,
        seqs: Sequence[int] | None = None,
    ) -> int:
        """See `VectorIndex.delete_messages` (`seqs` is not needed in memory)."""
        with self._lock:
            spaces = self._data.get(resource_id, {}).get(thread_id)
            if not spaces:
                return 0
            if message_ids is None:
                removed = sum(len(entries) for batches in spaces.values() for _, _, entries in batches)
                del self._data[resource_id][thread_id]
                return removed
            doomed = set(message_ids)
            removed = 0
            for space, batches in spaces.items():
                kept_batches = []
                for first, through, entries in batches:
                    kept = [e for e in entries if e.message_id not in doomed]
                    removed += len(entries) - len(kept)
                    kept_batches.append((first, through, kept))
                spaces[space] = kept_batches
            return removed

    def delete_resource(self, resource_id: str) -> None:
        with self._lock:
            self._data.pop(resource_id, None)

    def stats(self, resource_id: str) -> dict[str, int]:
        with self._lock:
            batches = [b for spaces in self._data.get(resource_id, {}).values() for bs in spaces.values() for b in bs]
            entries = [e for _, _, es in batches for e in es]
            size = sum(vec.packed_size(e.message_id, len(e.values)) for e in entries)
            return {'vectors': len(entries), 'bytes': size, 'items': len(batches)}

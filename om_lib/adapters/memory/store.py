"""`InMemoryStore`: the reference implementation of `MemoryStore`, for unit tests and single-process local runs.

It is the behaviour every other store must match (the conformance suite under tests/ runs against each).
A single lock makes every method atomic, which is what DynamoDB's single-item conditional writes give per item.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from om_lib.errors import (
    ErasedError,
    MessageConflictError,
    ThreadExistsError,
    ThreadNotFoundError,
    VersionConflictError,
)
from om_lib.messages import Message
from om_lib.ports import AppendResult, AttentionItem, MessagePage, PendingThread, ThreadPage
from om_lib.records import FailureNote, OMRecord, Thread, WorkingMemoryRecord


class _ThreadData:
    def __init__(self, thread: Thread) -> None:
        self.thread = thread
        self.by_id: dict[str, Message] = {}
        self.hashes: dict[str, str] = {}
        self.ordered: list[Message] = []  # seq order
        self.next_seq = 1


class InMemoryStore:
    """Threads, messages and OM records in process memory."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # (resource id, thread id) -> thread: thread ids are scoped to their resource.
        self._threads: dict[tuple[str, str], _ThreadData] = {}
        # key -> generations, oldest first; the last one is the head.
        self._records: dict[str, list[OMRecord]] = {}
        self._erased_keys: set[str] = set()
        # (resource id, thread id) -> last activity: threads the sweeper should look at.
        self._attention: dict[tuple[str, str], datetime] = {}
        # (resource id, thread id) -> pending since: resource-scope threads with unobserved messages.
        self._pending: dict[tuple[str, str], datetime] = {}
        # (resource id, thread id or None for resource scope) -> working memory.
        self._working: dict[tuple[str, str | None], WorkingMemoryRecord] = {}
        # (resource id, thread id or None for resource scope) -> failures, newest last (bounded).
        self._failures: dict[tuple[str, str | None], deque[FailureNote]] = {}
        # (resource id, thread id, user message id) -> (owner, lease end): who is answering that message.
        self._turn_claims: dict[tuple[str, str, str], tuple[str, datetime]] = {}

    # -- threads and messages -------------------------------------------------------------------------------------
    def append_messages(
        self,
        resource_id: str,
        thread_id: str,
        messages: Sequence[Message],
        *,
        now: datetime,
        include_record: bool = False,
        mark_pending: bool = False,
    ) -> AppendResult:
        """See `MemoryStore.append_messages`."""
        with self._lock:
            data = self._threads.get((resource_id, thread_id))
            # Validate everything before writing anything: a refused request writes nothing.
            seen: dict[str, str] = {}
            for message in messages:
                digest = message.content_hash()
                stored_hash = data.hashes.get(message.id) if data else None
                if stored_hash is not None and stored_hash != digest:
                    raise MessageConflictError(message.id)
                if seen.get(message.id, digest) != digest:
                    raise MessageConflictError(message.id)
                seen[message.id] = digest
            if data is None:
                data = _ThreadData(Thread(id=thread_id, resource_id=resource_id, created_at=now, updated_at=now))
                self._threads[(resource_id, thread_id)] = data
                # A new incarnation of an erased thread may start over; late work of the old one still fails
                # its version check because the old head is gone.
                self._erased_keys.discard(f'thread:{resource_id}/{thread_id}')
                self._erased_keys.discard(f'resource:{resource_id}')
            result: list[Message] = []
            created: list[str] = []
            for message in messages:
                existing = data.by_id.get(message.id)
                if existing is not None:
                    result.append(existing)
                    continue
                stored = message.model_copy(
                    update={'seq': data.next_seq, 'thread_id': thread_id, 'resource_id': resource_id}
                )
                data.next_seq += 1
                data.by_id[message.id] = stored
                data.hashes[message.id] = message.content_hash()
                data.ordered.append(stored)
                result.append(stored)
                created.append(message.id)
            if created:
                data.thread = data.thread.model_copy(update={'updated_at': now})
                self._attention[(resource_id, thread_id)] = now
                if mark_pending:
                    self._pending.setdefault((resource_id, thread_id), now)
            record = self.get_record(f'thread:{resource_id}/{thread_id}') if include_record else None
            return AppendResult(
                thread=data.thread,
                messages=tuple(result),
                created_ids=tuple(created),
                record=record,
                record_included=include_record,
            )

    def create_thread(
        self,
        resource_id: str,
        thread_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        now: datetime,
    ) -> Thread:
        """See `MemoryStore.create_thread`."""
        with self._lock:
            if (resource_id, thread_id) in self._threads:
                raise ThreadExistsError(thread_id)
            thread = Thread(
                id=thread_id,
                resource_id=resource_id,
                title=title,
                metadata=dict(metadata or {}),
                created_at=now,
                updated_at=now,
            )
            self._threads[(resource_id, thread_id)] = _ThreadData(thread)
            self._erased_keys.discard(f'thread:{resource_id}/{thread_id}')
            self._erased_keys.discard(f'resource:{resource_id}')
            return thread

    def get_messages(self, resource_id: str, thread_id: str, ids: Sequence[str]) -> list[Message]:
        """See `MemoryStore.get_messages`."""
        with self._lock:
            data = self._threads.get((resource_id, thread_id))
            if data is None:
                return []
            found = [data.by_id[i] for i in dict.fromkeys(ids) if i in data.by_id]
            return sorted(found, key=lambda m: m.seq or 0)

    def delete_messages(self, resource_id: str, thread_id: str, message_ids: Sequence[str] | None) -> int:
        """See `MemoryStore.delete_messages`."""
        with self._lock:
            data = self._threads.get((resource_id, thread_id))
            if data is None:
                raise ThreadNotFoundError(thread_id)
            doomed = set(data.by_id) if message_ids is None else {i for i in message_ids if i in data.by_id}
            for message_id in doomed:
                del data.by_id[message_id]
                data.hashes.pop(message_id, None)
            data.ordered = [m for m in data.ordered if m.id not in doomed]
            return len(doomed)

    def get_thread(self, resource_id: str, thread_id: str) -> Thread | None:
        """See `MemoryStore.get_thread`."""
        with self._lock:
            data = self._threads.get((resource_id, thread_id))
            if data is None:
                return None
            return data.thread

    def update_thread(self, thread: Thread) -> Thread:
        """See `MemoryStore.update_thread`."""
        with self._lock:
            data = self._threads.get((thread.resource_id, thread.id))
            if data is None:
                raise ThreadNotFoundError(thread.id)
            # Identity fields never change through an update.
            data.thread = thread.model_copy(update={'created_at': data.thread.created_at})
            return data.thread

    def list_messages(
        self,
        resource_id: str,
        thread_id: str,
        *,
        after_seq: int = 0,
        before_seq: int | None = None,
        limit: int = 100,
        newest_first: bool = False,
    ) -> MessagePage:
        """See `MemoryStore.list_messages`."""
        with self._lock:
            data = self._threads.get((resource_id, thread_id))
            if data is None:
                return MessagePage(messages=(), has_more=False)
            selected = [
                m
                for m in data.ordered
                if (m.seq or 0) > after_seq and (before_seq is None or (m.seq or 0) < before_seq)
            ]
            if newest_first:
                selected.reverse()
            return MessagePage(messages=tuple(selected[:limit]), has_more=len(selected) > limit)

    def list_threads(
        self, resource_id: str, *, limit: int = 100, cursor: str | None = None, newest_first: bool = False
    ) -> ThreadPage:
        """See `MemoryStore.list_threads`. Cursors are `<created_at ISO>#<thread_id>`, as in the DynamoDB store."""
        with self._lock:
            owned = sorted(
                (d.thread for (owner, _), d in self._threads.items() if owner == resource_id),
                key=_thread_order,
                reverse=newest_first,
            )
            if cursor is not None:
                owned = [t for t in owned if (_thread_order(t) < cursor if newest_first else _thread_order(t) > cursor)]
            page = owned[:limit]
            next_cursor = _thread_order(page[-1]) if len(owned) > limit else None
            return ThreadPage(threads=tuple(page), next_cursor=next_cursor)

    # -- OM records -----------------------------------------------------------------------------------------------
    def get_record(self, key: str) -> OMRecord | None:
        """See `MemoryStore.get_record`."""
        with self._lock:
            generations = self._records.get(key)
            return generations[-1] if generations else None

    def put_record(self, record: OMRecord, *, expected_version: int | None) -> OMRecord:
        """See `MemoryStore.put_record`."""
        with self._lock:
            self._check_not_erased(record)
            generations = self._records.setdefault(record.key, [])
            head = generations[-1] if generations else None
            if expected_version is None:
                if head is not None:
                    raise VersionConflictError(record.key, None)
                stored = record.model_copy(update={'version': 1})
                generations.append(stored)
                return stored
            if (
                head is None
                or head.id != record.id
                or head.version != expected_version
                or head.generation != record.generation
            ):
                raise VersionConflictError(record.key, expected_version)
            stored = record.model_copy(update={'version': expected_version + 1})
            generations[-1] = stored
            return stored

    def put_generation(self, new: OMRecord, *, expected_version: int) -> OMRecord:
        """See `MemoryStore.put_generation`."""
        with self._lock:
            self._check_not_erased(new)
            generations = self._records.get(new.key)
            head = generations[-1] if generations else None
            if head is None or head.version != expected_version or new.generation != head.generation + 1:
                raise VersionConflictError(new.key, expected_version)
            stored = new.model_copy(update={'version': expected_version + 1})
            assert generations is not None
            generations.append(stored)
            return stored

    def list_generations(self, key: str, *, limit: int = 10, before: int | None = None) -> list[OMRecord]:
        """See `MemoryStore.list_generations`."""
        with self._lock:
            newest_first = reversed(self._records.get(key, []))
            return [r for r in newest_first if before is None or r.generation < before][:limit]

    def rewrite_generation(self, record: OMRecord) -> None:
        """See `MemoryStore.rewrite_generation`."""
        with self._lock:
            generations = self._records.get(record.key, [])
            for index, old in enumerate(generations[:-1]):  # never the head
                if old.generation == record.generation:
                    generations[index] = record.model_copy(update={'version': old.version})

    def delete_generations(self, key: str, generations: Sequence[int]) -> None:
        """See `MemoryStore.delete_generations`."""
        doomed = set(generations)
        with self._lock:
            kept = self._records.get(key)
            if kept:
                self._records[key] = [r for r in kept[:-1] if r.generation not in doomed] + [kept[-1]]

    # -- erase ----------------------------------------------------------------------------------------------------
    def claim_turn(
        self, resource_id: str, thread_id: str, message_id: str, *, owner: str, now: datetime, lease: timedelta
    ) -> datetime | None:
        """See `MemoryStore.claim_turn`."""
        key = (resource_id, thread_id, message_id)
        with self._lock:
            held = self._turn_claims.get(key)
            if held is not None and held[0] != owner and held[1] > now:
                return held[1]
            self._turn_claims[key] = (owner, now + lease)
            return None

    def release_turn(self, resource_id: str, thread_id: str, message_id: str, *, owner: str) -> None:
        """See `MemoryStore.release_turn`."""
        key = (resource_id, thread_id, message_id)
        with self._lock:
            if self._turn_claims.get(key, ('', None))[0] == owner:
                del self._turn_claims[key]

    def delete_thread(self, resource_id: str, thread_id: str) -> None:
        """Remove a thread, its messages and its thread-scope records; later writes to them are refused."""
        with self._lock:
            if self._threads.pop((resource_id, thread_id), None) is None:
                raise ThreadNotFoundError(thread_id)
            for claim in [k for k in self._turn_claims if k[:2] == (resource_id, thread_id)]:
                del self._turn_claims[claim]
            self._attention.pop((resource_id, thread_id), None)
            self._pending.pop((resource_id, thread_id), None)
            key = f'thread:{resource_id}/{thread_id}'
            self._records.pop(key, None)
            self._erased_keys.add(key)
            self._working.pop((resource_id, thread_id), None)
            self._failures.pop((resource_id, thread_id), None)

    def delete_resource(self, resource_id: str) -> None:
        """Remove everything stored for a resource; later writes to it are refused."""
        with self._lock:
            for thread_id in [t for owner, t in self._threads if owner == resource_id]:
                self.delete_thread(resource_id, thread_id)
            key = f'resource:{resource_id}'
            self._records.pop(key, None)
            self._erased_keys.add(key)
            self._working.pop((resource_id, None), None)
            self._failures.pop((resource_id, None), None)

    # -- failures -------------------------------------------------------------------------------------------------
    def add_failure(self, resource_id: str, thread_id: str | None, failure: FailureNote) -> None:
        """See `MemoryStore.add_failure` (the newest 100 per memory are kept)."""
        with self._lock:
            if thread_id is not None and (resource_id, thread_id) not in self._threads:
                return
            self._failures.setdefault((resource_id, thread_id), deque(maxlen=100)).append(failure)

    def recent_failures(self, resource_id: str, thread_id: str | None, *, limit: int = 20) -> list[FailureNote]:
        """See `MemoryStore.recent_failures`."""
        with self._lock:
            kept = self._failures.get((resource_id, thread_id), ())
            return list(reversed(kept))[:limit]

    # -- working memory -------------------------------------------------------------------------------------------
    def get_working_memory(self, resource_id: str, thread_id: str | None) -> WorkingMemoryRecord | None:
        """See `MemoryStore.get_working_memory`."""
        with self._lock:
            if thread_id is not None and self.get_thread(resource_id, thread_id) is None:
                return None
            return self._working.get((resource_id, thread_id))

    def put_working_memory(self, memory: WorkingMemoryRecord, *, expected_version: int | None) -> WorkingMemoryRecord:
        """See `MemoryStore.put_working_memory`."""
        with self._lock:
            key = (memory.resource_id, memory.thread_id)
            if memory.thread_id is not None and self.get_thread(memory.resource_id, memory.thread_id) is None:
                raise ThreadNotFoundError(memory.thread_id)
            current = self._working.get(key)
            if (current is None) != (expected_version is None) or (
                current is not None and current.version != expected_version
            ):
                raise VersionConflictError(f'working-memory:{memory.resource_id}/{memory.thread_id}', expected_version)
            stored = memory.model_copy(update={'version': (expected_version or 0) + 1})
            self._working[key] = stored
            return stored

    def _check_not_erased(self, record: OMRecord) -> None:
        if record.key in self._erased_keys:
            raise ErasedError(f'{record.key} was erased; late work is dropped')

    # -- resource scope: pending threads ---------------------------------------------------------------------------
    def list_pending_threads(self, resource_id: str, *, limit: int = 100) -> list[PendingThread]:
        """See `MemoryStore.list_pending_threads`."""
        with self._lock:
            items = [
                PendingThread(thread_id=tid, pending_since=since)
                for (rid, tid), since in self._pending.items()
                if rid == resource_id
            ]
        return sorted(items, key=lambda p: (p.pending_since, p.thread_id))[:limit]

    def mark_pending(self, resource_id: str, thread_id: str, *, now: datetime) -> None:
        """See `MemoryStore.mark_pending`."""
        with self._lock:
            if (resource_id, thread_id) in self._threads:
                self._pending.setdefault((resource_id, thread_id), now)

    def clear_pending(self, resource_id: str, thread_id: str, *, observed_through: int) -> bool:
        """See `MemoryStore.clear_pending`."""
        with self._lock:
            data = self._threads.get((resource_id, thread_id))
            if data is None:
                return False
            if data.next_seq - 1 > observed_through:
                return False
            self._pending.pop((resource_id, thread_id), None)
            return True

    # -- the sweeper's attention list -------------------------------------------------------------------------------
    def list_attention(self, *, quiet_since: datetime, limit: int = 100) -> list[AttentionItem]:
        """See `MemoryStore.list_attention`."""
        with self._lock:
            items = [
                AttentionItem(resource_id=rid, thread_id=tid, active_at=at, mark=at.isoformat())
                for (rid, tid), at in self._attention.items()
                if at < quiet_since
            ]
        return sorted(items, key=lambda i: i.active_at)[:limit]

    def clear_attention(self, item: AttentionItem) -> None:
        """See `MemoryStore.clear_attention`."""
        with self._lock:
            current = self._attention.get((item.resource_id, item.thread_id))
            if current is not None and current.isoformat() == item.mark:
                del self._attention[(item.resource_id, item.thread_id)]


def _thread_order(thread: Thread) -> str:
    return f'{thread.created_at.astimezone(UTC).isoformat()}#{thread.id}'

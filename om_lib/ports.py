"""The small interfaces om_lib talks to the world through. Adapters implement them; the domain never imports an SDK."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from om_lib.llm import ModelRequest, ModelResponse
from om_lib.messages import Message
from om_lib.records import OMRecord, Thread


@runtime_checkable
class Clock(Protocol):
    """Wall-clock time (UTC) and a monotonic clock for deadlines. Injectable so tests control time."""

    def now(self) -> datetime:
        """Current UTC time, timezone-aware."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


@runtime_checkable
class StringTokenizer(Protocol):
    """Counts tokens of plain text (o200k in production)."""

    version: str

    def count(self, text: str) -> int:
        """Number of tokens of `text`; 0 for ''."""
        ...


@runtime_checkable
class LanguageModel(Protocol):
    """One provider's models (`google`, `offline`). Routing, fallbacks and retries live in om_lib.model_router."""

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        """Run one generation with `model_id` (the part after `provider/`).

        Not idempotent (each call is a new generation). Must return within `timeout_s` seconds, its own retries
        included. Raises ModelUnavailableError (transient: 408/429/5xx, timeouts, network), ModelRequestError
        (permanent: 4xx), or ModelOutputError (empty, blocked or unusable answer).
        """
        ...


@runtime_checkable
class BlobReader(Protocol):
    """Reads stored attachments (`s3://` URLs) back, for sending images to a model inline."""

    def read(self, url: str, *, max_bytes: int, resource_id: str | None = None) -> bytes | None:
        """The object's bytes, or None when it is missing, not ours to read, or larger than `max_bytes`.

        With `resource_id`, only that resource's objects are readable (another resource's URL reads as missing).
        """
        ...


@dataclass(frozen=True)
class AppendResult:
    """What `append_messages` did: the thread (created if new) and every message as stored (with `seq`).

    With `include_record=True`, `record` is the head of the thread-scope key (`thread:<resource>/<thread>`) as it was
    when the messages were appended (None when there is none yet) and `record_included` is True. A store reads it in
    the same round trip as the append where it can, which saves the step a `get_record` call.
    """

    thread: Thread
    messages: tuple[Message, ...]
    created_ids: tuple[str, ...]
    record: OMRecord | None = None
    record_included: bool = False


@dataclass(frozen=True)
class AttentionItem:
    """A thread with activity the sweeper has not looked at yet. `mark` is opaque; pass it back to clear it."""

    resource_id: str
    thread_id: str
    active_at: datetime
    mark: str


@dataclass(frozen=True)
class ThreadPage:
    """A page of a resource's threads, oldest first; pass `next_cursor` back for the next page (None: no more)."""

    threads: tuple[Thread, ...]
    next_cursor: str | None


@dataclass(frozen=True)
class MessagePage:
    """A page of messages in `seq` order."""

    messages: tuple[Message, ...]
    has_more: bool


class MemoryStore(Protocol):
    """Threads, messages and OM records. Every method keeps one resource's data apart from another's."""

    def append_messages(
        self,
        resource_id: str,
        thread_id: str,
        messages: Sequence[Message],
        *,
        now: datetime,
        include_record: bool = False,
    ) -> AppendResult:
        """Store messages in the thread, creating the thread (owned by `resource_id`) if it does not exist.

        Idempotent per message id: an id already stored with the same `content_hash()` is returned as stored and not
        written again. New messages get increasing `seq` numbers in the order given. Messages are stored with their
        token-count cache as given; inline base64 attachment `data` may be replaced by a stored `url` (and `size`).
        Raises ThreadNotFoundError when the thread belongs to another resource and MessageConflictError when an id is
        stored with other content; in both cases nothing is written. A thread that was erased starts over as a new
        thread (its old OM record stays gone). `include_record=True` also returns the thread-scope OM head (see
        `AppendResult`).
        """
        ...

    def create_thread(
        self,
        resource_id: str,
        thread_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        now: datetime,
    ) -> Thread:
        """Create an empty thread owned by `resource_id` with a title and metadata.

        Raises ThreadExistsError when the id is taken by a live thread of any resource (nothing is written; a thread
        of another resource still reads as missing everywhere else). An erased id may be created again (a new
        incarnation, as with `append_messages`).
        """
        ...

    def get_messages(self, resource_id: str, thread_id: str, ids: Sequence[str]) -> list[Message]:
        """The stored messages with these ids, in `seq` order. Unknown ids are left out; another resource's thread
        gives an empty list."""
        ...

    def delete_messages(self, resource_id: str, thread_id: str, message_ids: Sequence[str] | None) -> int:
        """Delete messages by id (`None`: every message of the thread) and return how many were deleted.

        Idempotent; unknown ids are ignored. The thread itself, its OM records and its other messages stay; the
        deleted messages' `seq`s never hold a message again and never hold up an ordered read. Raises
        ThreadNotFoundError when the thread does not exist or belongs to another resource.
        """
        ...

    def get_thread(self, resource_id: str, thread_id: str) -> Thread | None:
        """The thread, or None when it does not exist or belongs to another resource."""
        ...

    def update_thread(self, thread: Thread) -> Thread:
        """Replace a thread's title, metadata and hints (last write wins; `updated_at` is the caller's).

        Raises ThreadNotFoundError if the thread is gone (erased) or belongs to another resource.
        """
        ...

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
        """Messages with `after_seq < seq < before_seq`, oldest first (or newest first), at most `limit` of them.

        Reads only the requested range, never the whole history. An unknown thread gives an empty page.
        """
        ...

    def get_record(self, key: str) -> OMRecord | None:
        """The head (newest generation) of a key, or None."""
        ...

    def put_record(self, record: OMRecord, *, expected_version: int | None) -> OMRecord:
        """Write the head of `record.key` and return it with `version` bumped by one.

        `expected_version=None` creates the key's first record and fails if one exists; otherwise the write succeeds
        only if the stored head still has that version and the same generation. Raises VersionConflictError on a lost
        race (nothing written) and ErasedError when the key's thread or resource was erased.
        """
        ...

    def put_generation(self, new: OMRecord, *, expected_version: int) -> OMRecord:
        """Make `new` (generation = head's + 1) the head, keeping the old head readable as history.

        Conditional on the current head's `version`; raises VersionConflictError if it moved, ErasedError if erased.
        """
        ...

    def list_generations(self, key: str, *, limit: int = 10) -> list[OMRecord]:
        """Generations of a key, newest first."""
        ...

    def list_threads(self, resource_id: str, *, limit: int = 100, cursor: str | None = None) -> ThreadPage:
        """A resource's threads, oldest first (by creation), `limit` per page; `cursor` continues a listing.

        May lag a thread created a moment ago (DynamoDB lists threads through an eventually consistent index).
        """
        ...

    def delete_thread(self, resource_id: str, thread_id: str) -> None:
        """Erase a thread: its messages, its thread-scope OM record (every generation) and its stored attachments.

        Leaves a tombstone: a later `put_record`/`put_generation` of the erased record raises ErasedError, and the
        erased head can never be written back. A later `append_messages` to the same id starts a new, empty thread.
        Raises ThreadNotFoundError when the thread does not exist or belongs to another resource.
        """
        ...

    def delete_resource(self, resource_id: str) -> None:
        """Erase everything stored for a resource: every thread (as `delete_thread`), the resource-scope record.

        Leaves a tombstone, so late work on the resource-scope record raises ErasedError. Idempotent.
        """
        ...

    def list_attention(self, *, quiet_since: datetime, limit: int = 100) -> list[AttentionItem]:
        """Threads whose last activity (a stored message) is older than `quiet_since` and not yet cleared.

        Every append marks its thread (the mark moves to the newest activity). Reads an index, never scans.
        """
        ...

    def clear_attention(self, item: AttentionItem) -> None:
        """Remove the mark, unless the thread had new activity since `item` was listed (then it stays marked)."""
        ...

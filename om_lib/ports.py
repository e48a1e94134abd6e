"""The small interfaces om_lib talks to the world through. Adapters implement them; the domain never imports an SDK."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable

from om_lib.events import LifecycleEvent
from om_lib.llm import ModelRequest, ModelResponse
from om_lib.messages import Message
from om_lib.records import FailureNote, OMRecord, Thread, WorkingMemoryRecord


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
    """One provider's models (`google`, `offline`).

    Routing, fallbacks and retries live in om_lib.models.model_router.
    """

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        """Run one generation with `model_id` (the part after `provider/`).

        The answer's `model` is `model_id` when that model answered; a provider that answers in another model's
        place (the offline stand-in) names itself instead (`offline/…`), so usage says which model really ran.
        Not idempotent (each call is a new generation). Must return within `timeout_s` seconds, its own retries
        included. Raises ModelUnavailableError (transient: 408/429/5xx, timeouts, network), ModelRequestError
        (permanent: 4xx), or ModelOutputError (empty, blocked or unusable answer).
        """
        ...


# Receives an answer's text piece by piece as the model streams it.
TextSink = Callable[[str], None]


@runtime_checkable
class StreamingLanguageModel(Protocol):
    """A provider that can also stream an answer (the chat Actor's reply, shown as it is written)."""

    def stream(self, model_id: str, request: ModelRequest, *, timeout_s: float, on_text: TextSink) -> ModelResponse:
        """Like `generate`, but hand the answer's text to `on_text` piece by piece while it arrives.

        Returns the whole answer (its text is the pieces joined) with its function calls and usage, and raises the
        same errors as `generate`, also after some text was handed on (the caller then must not retry: its listener
        has part of an answer). `on_text` must not raise.
        """
        ...


@runtime_checkable
class EventPublisher(Protocol):
    """Where lifecycle events go (an EventBridge bus in AWS, a list in tests): om_lib/events.py."""

    def publish(self, events: Sequence[LifecycleEvent]) -> None:
        """Publish `events` in order, in as few calls as the destination allows.

        Best effort and never raises: an event that cannot be published is logged (and counted by the adapter's
        owner); the outcome it reports has happened and stays as it is.
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
class PendingThread:
    """A thread of a resource with messages that the resource-scope record has not observed yet."""

    thread_id: str
    pending_since: datetime


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
        mark_pending: bool = False,
    ) -> AppendResult:
        """Store messages in the thread, creating the thread (owned by `resource_id`) if it does not exist.

        Idempotent per message id: an id already stored with the same `content_hash()` is returned as stored and not
        written again. New messages get increasing `seq` numbers in the order given. Messages are stored with their
        token-count cache as given; inline base64 attachment `data` may be replaced by a stored `url` (and `size`).
        Thread ids are scoped to their resource: another resource's thread of the same id is another thread, which
        this call never reads nor changes. Raises MessageConflictError when an id is stored with other content;
        nothing is written then. An append that stores nothing new (all ids already stored, or none sent) changes
        nothing but creating a missing thread: not `updated_at`, not the sweeper's or the pending marks. A thread that
        was erased starts over as a new thread (its old OM record stays gone). `include_record=True` also returns the
        thread-scope OM head (see `AppendResult`). `mark_pending=True` (resource scope) lists the thread among the
        resource's pending threads (`list_pending_threads`) in the same write, keeping the time it first became
        pending.
        """
        ...

    def list_pending_threads(self, resource_id: str, *, limit: int = 100) -> list[PendingThread]:
        """The resource's threads marked pending, longest-pending first, at most `limit` (reads an index).

        May lag an append made a moment ago (DynamoDB reads the index eventually consistently).
        """
        ...

    def mark_pending(self, resource_id: str, thread_id: str, *, now: datetime) -> None:
        """List a thread among the resource's pending ones (its observations were dropped and must be redone).

        Does nothing for a thread that is gone or belongs to another resource.
        """
        ...

    def clear_pending(self, resource_id: str, thread_id: str, *, observed_through: int) -> bool:
        """Unmark a pending thread whose messages up to sequence `observed_through` are observed.

        Does nothing (and returns False) when the thread has a later message, stored or being stored, so a message
        that arrives during an observation keeps its thread pending, or when the thread is gone. True when the mark
        was removed (or was not there).
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

        Raises ThreadExistsError when the resource already has a live thread of this id (nothing is written); thread
        ids are scoped to their resource, so another resource's thread of the same id is no obstacle and is never
        revealed. An erased id may be created again (a new incarnation, as with `append_messages`).
        """
        ...

    def claim_turn(
        self, resource_id: str, thread_id: str, message_id: str, *, owner: str, now: datetime, lease: timedelta
    ) -> datetime | None:
        """Take the right to answer user message `message_id` for `lease` (one conditional write): None when taken (no
        claim, an expired one, or one `owner` already holds, which is renewed), else when the holder's lease ends.

        The claim keeps concurrent requests for one message from each calling the Actor; the stored reply, not the
        claim, is what says the message was answered. A claim outlives neither its lease nor its thread's erasure.
        """
        ...

    def release_turn(self, resource_id: str, thread_id: str, message_id: str, *, owner: str) -> None:
        """Give the claim back (only `owner`'s claim is removed; a lost or expired one is no error)."""
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

    def list_generations(self, key: str, *, limit: int = 10, before: int | None = None) -> list[OMRecord]:
        """Generations of a key, newest first: from the head, or (`before`) the earlier ones below that generation."""
        ...

    def rewrite_generation(self, record: OMRecord) -> None:
        """Replace an earlier generation's content with `record` (same key and generation; never the head).

        For forgetting (`om_lib.history.forgetting`): a generation that observed deleted messages, rewritten without
        them. Does nothing when that generation is gone, or is the head (which changes only through `put_record` and
        `put_generation`).
        """
        ...

    def delete_generations(self, key: str, generations: Sequence[int]) -> None:
        """Delete earlier generations of a key (never the head; unknown ones are ignored). Idempotent."""
        ...

    def list_threads(
        self, resource_id: str, *, limit: int = 100, cursor: str | None = None, newest_first: bool = False
    ) -> ThreadPage:
        """A resource's threads, oldest first (by creation; `newest_first` reverses), `limit` per page; `cursor`
        continues a listing in the same direction.

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

    def get_working_memory(self, resource_id: str, thread_id: str | None) -> WorkingMemoryRecord | None:
        """The working memory of a resource (`thread_id=None`) or of one of its threads (thread scope), or None.

        A thread that does not exist or belongs to another resource has none.
        """
        ...

    def put_working_memory(self, memory: WorkingMemoryRecord, *, expected_version: int | None) -> WorkingMemoryRecord:
        """Write working memory and return it with `version` bumped by one.

        `expected_version=None` creates it and fails if it exists; otherwise the stored version must still be that
        one. Raises VersionConflictError on a lost race (nothing written) and, in thread scope, ThreadNotFoundError
        when the thread does not exist or belongs to another resource. Erasing the thread (thread scope) or the
        resource erases it.
        """
        ...

    def add_failure(self, resource_id: str, thread_id: str | None, failure: FailureNote) -> None:
        """Keep one failure for a thread's memory (`thread_id`) or a resource's (`None`, resource scope).

        Not idempotent (each call keeps one more); kept for a bounded time (the DynamoDB store lets them expire after
        30 days) and erased with the thread or resource. Does nothing for a thread that is gone.
        """
        ...

    def recent_failures(self, resource_id: str, thread_id: str | None, *, limit: int = 20) -> list[FailureNote]:
        """The newest failures kept with `add_failure`, newest first, at most `limit`."""
        ...

    def list_attention(self, *, quiet_since: datetime, limit: int = 100) -> list[AttentionItem]:
        """Threads whose last activity (a stored message) is older than `quiet_since` and not yet cleared.

        Every append marks its thread (the mark moves to the newest activity). Reads an index, never scans.
        """
        ...

    def clear_attention(self, item: AttentionItem) -> None:
        """Remove the mark, unless the thread had new activity since `item` was listed (then it stays marked)."""
        ...


# ---------------------------------------------------------------------------------------------------------------------
# Semantic search (retrieval: {vector: true}, semanticRecall)
# ---------------------------------------------------------------------------------------------------------------------
EmbeddingKind = Literal['document', 'query']


@runtime_checkable
class Embedder(Protocol):
    """Turns text into vectors (Gemini's embedding API in production, a local model or a hashing embedder offline).

    `name` identifies the vector space (model and dimensions): vectors of different names are never compared.
    """

    name: str
    dimensions: int

    def embed(self, texts: Sequence[str], *, kind: EmbeddingKind, timeout_s: float) -> list[list[float]]:
        """One vector per text, in order. `kind` is what the text is for (stored message or search query).

        Must return within `timeout_s`. Raises ModelUnavailableError (transient) or ModelRequestError (permanent).
        """
        ...


@dataclass(frozen=True)
class VectorEntry:
    """A stored message's vector (unit length) in the index."""

    message_id: str
    seq: int
    vector: Sequence[float]


@dataclass(frozen=True)
class VectorHit:
    """A search result: which message of which thread, and its cosine similarity to the query."""

    thread_id: str
    message_id: str
    seq: int
    score: float


class VectorIndex(Protocol):
    """Message vectors kept per resource, searchable one resource (or one of its threads) at a time.

    Implementations: `DynamoVectorIndex` (compact int8 vectors in the memory table, no vector database) and
    `InMemoryVectorIndex`; S3 Vectors or OpenSearch could implement the same port. Every method keeps one resource's
    vectors apart from another's; `space` is the embedder's `name` (vectors of another space are never returned).
    """

    def indexed_through(self, resource_id: str, thread_id: str, *, space: str) -> int:
        """The highest `seq` of the thread that has been indexed (0: none). Messages up to it need no embedding."""
        ...

    def add(
        self, resource_id: str, thread_id: str, entries: Sequence[VectorEntry], *, through_seq: int, space: str
    ) -> bool:
        """Store a batch of vectors covering the thread's messages up to `through_seq` (entries may be empty).

        Idempotent: a batch that starts where one was already stored is not written again (returns False).
        """
        ...

    def search(
        self, resource_id: str, query: Sequence[float], *, space: str, top_k: int, thread_id: str | None = None
    ) -> list[VectorHit]:
        """The `top_k` most similar stored messages of the resource (or of one thread), best first."""
        ...

    def delete_messages(
        self,
        resource_id: str,
        thread_id: str,
        message_ids: Sequence[str] | None,
        *,
        seqs: Sequence[int] | None = None,
    ) -> int:
        """Remove the vectors of these messages (`None`: every vector of the thread). Returns how many went.

        `seqs` (the messages' `seq`s, when the caller knows them) is a hint: an index may then read only the batches
        that can hold them instead of every batch of the thread.
        """
        ...

    def delete_resource(self, resource_id: str) -> None:
        """Remove every vector of the resource."""
        ...

    def stats(self, resource_id: str) -> dict[str, int]:
        """`{vectors, bytes, items}` stored for the resource (benchmarks and tests)."""
        ...

"""Semantic search over raw messages: `retrieval: {vector: true}` (the recall tool's `search` mode) and
`semanticRecall` (`topK` / `messageRange` / `scope`, `vectorSearchString`, the chat endpoint's recalled context).

`SemanticMemory` joins three ports: the `MemoryStore` (messages), an `Embedder` (Gemini's embedding API by default)
and a `VectorIndex` (compact int8 vectors per resource in the memory table). It never slows a step:

- **Indexing** happens off the request path. After each turn (`POST .../turns`, `POST .../chat`) an `embed` job goes
  to the work queue; the buffer worker runs `index_thread`, which embeds the thread's messages after the index's
  watermark (`indexed_through`) in batches and stores them. Jobs are idempotent (a batch is keyed by its first
  `seq`), so duplicates and retries are harmless. Without a work queue (tests, embedded tools) it runs inline after
  the turn instead.
- **Searching** first catches up the caller's own thread (a few messages at most, one embedding call), embeds the
  query, and scans the resource's vectors (or the thread's, in thread scope). Nothing outside the caller's resource is
  ever read: the index is partitioned by resource and every hit is read back through the store, which checks the owner.
- **Erasing** (`erase_thread`, `erase_resource`, `forget_messages`) removes vectors with the messages. An indexing job
  that was running during an erase notices the thread is gone afterwards and removes what it wrote; one that embedded
  a message deleted meanwhile removes that message's vector.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Literal

from om_lib.config import SemanticRecallSettings
from om_lib.errors import OMError
from om_lib.messages import FilePart, ImagePart, Message, TextPart, ToolCallPart, ToolResultPart, time_of
from om_lib.ports import Embedder, MemoryStore, VectorEntry, VectorIndex
from om_lib.work import BackgroundWork, Job

logger = logging.getLogger(__name__)

Scope = Literal['thread', 'resource']

# Messages embedded per store read / embedding call while indexing.
INDEX_BATCH = 100
# Time an indexing job may take (the worker passes its own deadline when it has one).
INDEX_BUDGET_S = 60.0
# Time a search may spend catching up the caller's thread and embedding the query.
SEARCH_BUDGET_S = 5.0
# Characters of a message shown in recalled context (the Actor's system message) and of a tool result embedded.
RECALLED_CHARS = 1500
_TOOL_RESULT_CHARS = 500


@dataclass(frozen=True)
class SearchResult:
    """A matching message and its cosine similarity to the query."""

    message: Message
    score: float


def embedding_text(message: Message) -> str:
    """The text a message is embedded as: its text parts, tool names, short tool results and attachment names."""
    if message.role == 'system':
        return ''
    pieces: list[str] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            pieces.append(part.text)
        elif isinstance(part, ToolCallPart):
            pieces.append(f'[Tool Call: {part.tool_name}] {json.dumps(part.args, default=str)[:_TOOL_RESULT_CHARS]}')
        elif isinstance(part, ToolResultPart):
            result = part.result if isinstance(part.result, str) else json.dumps(part.result, default=str)
            pieces.append(f'[Tool Result: {part.tool_name}] {result[:_TOOL_RESULT_CHARS]}')
        elif isinstance(part, ImagePart | FilePart) and part.filename:
            pieces.append(f'[{"Image" if isinstance(part, ImagePart) else "File"}: {part.filename}]')
    return '\n'.join(p for p in pieces if p.strip()).strip()


def embed_job(resource_id: str, thread_id: str, reason: str = 'turn') -> Job:
    """The background job that indexes a thread (its own FIFO group, so it never waits behind an observation)."""
    return Job('embed', resource_id, thread_id, f'vec:{resource_id}/{thread_id}', reason)


class SemanticMemory:
    """Indexing, searching and erasing message vectors (module docstring)."""

    def __init__(
        self, store: MemoryStore, index: VectorIndex, embedder: Embedder, *, work: BackgroundWork | None = None
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        # Where `embed` jobs go; None: index inline after the turn (no work queue).
        self.work = work

    @property
    def space(self) -> str:
        """The embedding space vectors are stored and searched in (the embedder's name)."""
        return self.embedder.name

    # -- indexing -----------------------------------------------------------------------------------------------
    def index_thread(self, resource_id: str, thread_id: str, *, deadline: float | None = None) -> int:
        """Embed and store the thread's messages that are not indexed yet; returns how many vectors were added.

        Stops at `deadline` (monotonic); the next job or search carries on from the watermark. A thread that is gone
        (erased, or another resource's) indexes nothing, and its vectors are removed.
        """
        limit = deadline if deadline is not None else time.monotonic() + INDEX_BUDGET_S
        if self.store.get_thread(resource_id, thread_id) is None:
            self.index.delete_messages(resource_id, thread_id, None)
            return 0
        through = self.index.indexed_through(resource_id, thread_id, space=self.space)
        added = 0
        written: list[str] = []
        while time.monotonic() < limit:
            page = self.store.list_messages(resource_id, thread_id, after_seq=through, limit=INDEX_BATCH)
            if not page.messages:
                break
            texts = [(m, embedding_text(m)) for m in page.messages]
            texts = [(m, t) for m, t in texts if t]
            vectors = (
                self.embedder.embed(
                    [t for _, t in texts], kind='document', timeout_s=max(0.1, limit - time.monotonic())
                )
                if texts
                else []
            )
            entries = [VectorEntry(m.id, m.seq or 0, v) for (m, _), v in zip(texts, vectors, strict=True)]
            last = max(m.seq or 0 for m in page.messages)
            if self.index.add(resource_id, thread_id, entries, through_seq=last, space=self.space):
                added += len(entries)
                written += [e.message_id for e in entries]
            through = last
            if not page.has_more:
                break
        if added and self.store.get_thread(resource_id, thread_id) is None:
            # Erased while we were embedding: what we wrote must not outlive it.
            self.index.delete_messages(resource_id, thread_id, None)
            return 0
        if written:
            # A message deleted while we were embedding it: its deletion may have run before our write.
            present = {m.id for m in self.store.get_messages(resource_id, thread_id, written)}
            gone = [i for i in written if i not in present]
            if gone:
                self.index.delete_messages(resource_id, thread_id, gone)
                added -= len(gone)
        return added

    def schedule(self, resource_id: str, thread_id: str) -> None:
        """Index the thread in the background (a job); inline when there is no work queue. Never raises."""
        try:
            if self.work is not None:
                self.work.submit(embed_job(resource_id, thread_id))
            else:
                self.index_thread(resource_id, thread_id)
        except Exception:  # noqa: BLE001 - indexing is best effort; the next turn or search catches up
            logger.warning('could not index the thread', exc_info=True, extra={'thread_id': thread_id})

    # -- searching ----------------------------------------------------------------------------------------------
    def search(
        self,
        resource_id: str,
        query: str,
        *,
        current_thread_id: str | None,
        scope: Scope = 'resource',
        top_k: int = 4,
        exclude_ids: Iterable[str] = (),
        catch_up: bool = True,
    ) -> list[SearchResult]:
        """The `top_k` messages most similar to `query`, best first, within the caller's resource.

        Scope `'thread'` searches only `current_thread_id`. Messages in `exclude_ids` (already in the Actor's
        context) are left out. `catch_up` first indexes what the current thread's jobs have not yet (one embedding
        call when there is anything); the chat endpoint skips it, since the thread's unindexed messages are the ones in
        the Actor's context anyway. Raises ModelError when the query cannot be embedded.
        """
        if not query.strip() or top_k <= 0:
            return []
        deadline = time.monotonic() + SEARCH_BUDGET_S
        if current_thread_id is not None and catch_up:
            try:
                self.index_thread(resource_id, current_thread_id, deadline=deadline)
            except OMError:
                logger.warning('could not catch up the thread index', exc_info=True)
        vector = self.embedder.embed([query], kind='query', timeout_s=max(0.5, deadline - time.monotonic()))[0]
        excluded = set(exclude_ids)
        thread_filter = current_thread_id if scope == 'thread' else None
        hits = self.index.search(
            resource_id, vector, space=self.space, top_k=top_k + len(excluded), thread_id=thread_filter
        )
        hits = [h for h in hits if h.message_id not in excluded][:top_k]
        by_thread: dict[str, list[str]] = {}
        for hit in hits:
            by_thread.setdefault(hit.thread_id, []).append(hit.message_id)
        found: dict[tuple[str, str], Message] = {}
        for thread_id, ids in by_thread.items():
            # Read back through the store: it checks the owner, and a message deleted since is simply not found.
            for message in self.store.get_messages(resource_id, thread_id, ids):
                found[(thread_id, message.id)] = message.model_copy(update={'thread_id': thread_id})
        return [
            SearchResult(found[(h.thread_id, h.message_id)], h.score)
            for h in hits
            if (h.thread_id, h.message_id) in found
        ]

    def recall_context(
        self,
        resource_id: str,
        thread_id: str,
        query: str,
        settings: SemanticRecallSettings,
        *,
        exclude_ids: Iterable[str] = (),
        catch_up: bool = True,
    ) -> list[Message]:
        """`semanticRecall`: the `topK` matches with `messageRange` neighbours each, de-duplicated.

        Ordered by thread (other threads first, by their first match's time) and then by arrival order.
        """
        excluded = set(exclude_ids)
        results = self.search(
            resource_id,
            query,
            current_thread_id=thread_id,
            scope=settings.scope,
            top_k=settings.top_k,
            exclude_ids=excluded,
            catch_up=catch_up,
        )
        picked: dict[tuple[str, str], Message] = {}
        for result in results:
            match = result.message
            match_thread = match.thread_id or thread_id
            seq = match.seq or 0
            around = [match]
            if settings.before > 0:
                older = self.store.list_messages(
                    resource_id, match_thread, before_seq=seq, limit=settings.before, newest_first=True
                )
                around += older.messages
            if settings.after > 0:
                around += self.store.list_messages(
                    resource_id, match_thread, after_seq=seq, limit=settings.after
                ).messages
            for message in around:
                if message.id not in excluded:
                    picked[(match_thread, message.id)] = message.model_copy(update={'thread_id': match_thread})
        first_seen: dict[str, float] = {}
        for message in picked.values():
            moment = time_of(message).timestamp()
            first_seen[message.thread_id or ''] = min(first_seen.get(message.thread_id or '', moment), moment)
        return sorted(
            picked.values(),
            key=lambda m: (m.thread_id == thread_id, first_seen[m.thread_id or ''], m.thread_id or '', m.seq or 0),
        )

    # -- erasing ------------------------------------------------------------------------------------------------
    def forget_messages(
        self,
        resource_id: str,
        thread_id: str,
        message_ids: Sequence[str] | None,
        *,
        seqs: Sequence[int] | None = None,
    ) -> int:
        """Remove the vectors of deleted messages (`None`: the whole thread's). `seqs`, their arrival numbers when
        known, lets the index rewrite only the batches that hold them."""
        return self.index.delete_messages(resource_id, thread_id, message_ids, seqs=seqs)

    def erase_thread(self, resource_id: str, thread_id: str) -> None:
        """Remove every vector of an erased thread."""
        self.index.delete_messages(resource_id, thread_id, None)

    def erase_resource(self, resource_id: str) -> None:
        """Remove every vector of an erased resource."""
        self.index.delete_resource(resource_id)


def format_recalled(messages: Sequence[Message], current_thread_id: str) -> str:
    """Recalled messages as a section of the Actor's system message (empty when there are none)."""
    if not messages:
        return ''
    lines = [
        '<semantic-recall>',
        'Earlier messages that may be relevant to the latest user message (found by similarity; they may be out of '
        'date, and the observations above take precedence):',
    ]
    current: str | None = None
    for message in messages:
        thread = message.thread_id or current_thread_id
        if thread != current:
            current = thread
            where = 'this conversation' if thread == current_thread_id else 'another conversation'
            lines.append(f'\nFrom {where}:')
        text = embedding_text(message) or '(no text)'
        if len(text) > RECALLED_CHARS:
            text = text[:RECALLED_CHARS] + '…'
        stamp = time_of(message).astimezone(UTC).strftime('%Y-%m-%d %H:%M')
        lines.append(f'- {message.role} ({stamp}): {text}')
    lines.append('</semantic-recall>')
    return '\n'.join(lines)

"""Forgetting: when messages are deleted (or a thread is erased), what was derived from them goes too.

Besides the messages themselves, their content reaches these *holders*, each handled by one class below, run in this
order by `forget`:

1. `LiveMemory`: the memory a step shows, of the thread (thread scope) and of its resource (resource scope): the
   observation log with its groups and cursors, the archive of groups moved out of the log past its bound
   (om_lib/reflection/archive.py), buffered chunks not yet active, a staged reflection, the continuation hints on the
   thread, and work in flight that read the messages (an observation or a buffering job: its result is thrown away when
   it commits).
2. `EarlierGenerations`: the generations `GET …/memory/generations` lists. One that observed, buffered or reflected a
   forgotten message is rewritten without it where that can be done exactly (a resource memory no reflection has
   condensed: the thread's `<thread>` sections go) and dropped otherwise.
3. `MessageVectors`: the vector index of semantic search.

Another holder of derived content is one more class with a `forget(forgotten)` method, listed in `holders()`.

The live memory's rules are the simplest honest ones, because a log keeps no per-message text boundaries (a
reflection rewrites and merges the whole log):

- clearing a thread, or deleting a message it observed (inside a group's range, or at or below its cursor), resets the
  thread's memory: a new generation with no observations, no groups, an empty archive, its cursor back at 0, so the
  messages that remain are observed again from the start;
- deleting only unobserved messages touches no observations; buffered chunks that covered one are dropped (activated,
  they would bring its content back);
- resource scope keeps one log for every thread, with a `<thread id>` section per observation: deleting observed
  messages of a thread (or erasing it) removes that thread's sections, archived groups and cursor in a new generation
  and lists the thread as pending, so what remains of it is observed again. Once the log has been reflected (or
  archived: an archive generation may descend from a reflected one) the sections may have been condensed together,
  so then the whole resource memory is reset and every thread it had observed is pending.

A clone is a thread of its own, with copies of the messages and of the memory it started with: deleting messages of
the source does not touch the clone (delete them there too, or erase the clone).

Cost: the forgotten messages are found by id; each memory's earlier generations are read once, a page at a time;
only the vector batches that hold a forgotten message are rewritten. Nothing reads the whole thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from om_lib.history.semantic import SemanticMemory
from om_lib.observation import resource_scope as rs
from om_lib.ports import MemoryStore
from om_lib.records import NO_STAGED_REFLECTION, ArchivedGroup, BufferedChunk, OMRecord, Scope, record_key
from om_lib.runtime.record_writer import RecordWriter

logger = logging.getLogger(__name__)

# Earlier generations read per store call while forgetting.
GENERATIONS_PAGE = 20


@dataclass(frozen=True)
class Forgotten:
    """What is being forgotten: messages of one thread (`seqs` None: all of them) and the memories that may hold them.

    `scopes` names the memories: both for deleted messages, only `resource` for an erased thread (its own memory went
    with it).
    """

    resource_id: str
    thread_id: str
    message_ids: tuple[str, ...] | None
    seqs: frozenset[int] | None
    now: datetime
    scopes: tuple[Scope, ...] = ('thread', 'resource')

    def keys(self) -> list[str]:
        """The record keys of the memories that may hold what was derived from the messages."""
        return [record_key(scope, self.resource_id, self.thread_id) for scope in self.scopes]

    def observed_by(self, record: OMRecord) -> bool:
        """Did this generation observe a forgotten message (its log may hold what was derived from it)?"""
        thread = self.thread_id
        groups = [g for g in record.groups if g.thread_id == thread]
        cursor = record.cursor(thread)
        if self.seqs is None:
            observed = cursor > 0 or bool(groups)
            if record.scope == 'thread':  # the whole log is this thread's
                observed = (
                    observed
                    or bool(record.active_observations.strip())
                    or bool(record.buffered_chunks)
                    or bool(record.archived)
                )
            return observed
        return any(s <= cursor or any(g.start_seq <= s <= g.end_seq for g in groups) for s in self.seqs)

    def buffered_in(self, record: OMRecord) -> bool:
        """Does a buffered chunk of this generation cover a forgotten message?"""
        return any(self.covers_chunk(c) for c in record.buffered_chunks)

    def touches(self, record: OMRecord) -> bool:
        """Does this generation hold anything derived from a forgotten message?"""
        return self.observed_by(record) or self.buffered_in(record)

    def covers_chunk(self, chunk: BufferedChunk) -> bool:
        """Was a forgotten message observed into this buffered chunk?"""
        if chunk.thread_id != self.thread_id:
            return False
        return self.seqs is None or any(chunk.start_seq <= s <= chunk.end_seq for s in self.seqs)


class DerivedContent(Protocol):
    """A holder of what was derived from messages."""

    def forget(self, forgotten: Forgotten) -> None:
        """Remove what was derived from the forgotten messages (idempotent)."""
        ...


def forget(holders: Iterable[DerivedContent], forgotten: Forgotten) -> None:
    """Run every holder, in order (the live memory first: the generation it retires is then cleaned as an earlier
    one)."""
    for holder in holders:
        holder.forget(forgotten)


def holders(
    writer: RecordWriter, *, count: Callable[[str], int] | None = None, semantic: SemanticMemory | None = None
) -> list[DerivedContent]:
    """Every holder of derived content, in the order `forget` runs them."""
    found: list[DerivedContent] = [LiveMemory(writer, count), EarlierGenerations(writer.store, count)]
    if semantic is not None:
        found.append(MessageVectors(semantic))
    return found


# ---------------------------------------------------------------------------------------------------------------------
# 1. The live memory
# ---------------------------------------------------------------------------------------------------------------------
class LiveMemory:
    """The heads of the thread's and the resource's records, and the continuation hints (module docstring)."""

    def __init__(self, writer: RecordWriter, count: Callable[[str], int] | None = None) -> None:
        self.writer = writer
        self.count = count

    def forget(self, forgotten: Forgotten) -> None:
        """Reset or trim each memory; the thread's continuation hints go when an observation was dropped."""
        reset = [self._forget_in(key, forgotten) for key in forgotten.keys()]
        if any(reset) and 'thread' in forgotten.scopes:
            store = self.writer.store
            thread = store.get_thread(forgotten.resource_id, forgotten.thread_id)
            if thread is not None and (thread.current_task or thread.suggested_response):
                store.update_thread(thread.model_copy(update={'current_task': None, 'suggested_response': None}))

    def _forget_in(self, key: str, forgotten: Forgotten) -> bool:
        """Reset or trim one memory; True when observations were dropped."""
        head = self.writer.head(key)
        if head is None:
            return False
        if head.scope == 'resource':
            if self._forget_in_resource(head, forgotten):
                return True
        else:
            built = self.writer.commit_generation(
                head, lambda current: reset(self.writer, current) if forgotten.observed_by(current) else None
            )
            if built is not None:
                return True
        self.writer.commit(head, lambda current: _without_unobserved(current, forgotten))
        return False

    def _forget_in_resource(self, head: OMRecord, forgotten: Forgotten) -> bool:
        thread_id = forgotten.thread_id
        if not forgotten.observed_by(head):
            return False
        store = self.writer.store
        if head.origin in ('reflection', 'archive'):
            # A reflection may have merged this thread's lines with others' (an archive generation may descend from
            # one): start the resource memory over.
            self.writer.commit_generation(head, lambda current: reset(self.writer, current))
            for other in {*head.cursors, thread_id}:
                store.mark_pending(head.resource_id, other, now=forgotten.now)
            return True

        def without(current: OMRecord) -> OMRecord | None:
            if not forgotten.observed_by(current):
                return None
            return self.writer.next_generation(
                current,
                **without_thread(current, thread_id, self.count),
                # Work in flight read the old log (and maybe the thread's messages): none of it may land here.
                observing=None,
                buffering_observation=None,
                deletions=current.deletions + 1,
            )

        self.writer.commit_generation(head, without)
        store.mark_pending(head.resource_id, thread_id, now=forgotten.now)
        return True


def _without_unobserved(current: OMRecord, forgotten: Forgotten) -> OMRecord | None:
    """`current` without buffered chunks that covered a forgotten message, and with the work in flight that may have
    read one disowned: an observation loses its lease, a buffering job finds `deletions` moved and drops its chunk."""
    chunks = tuple(c for c in current.buffered_chunks if not forgotten.covers_chunk(c))
    update: dict[str, Any] = {'deletions': current.deletions + 1, 'observing': None, 'buffering_observation': None}
    if chunks != current.buffered_chunks:
        update['buffered_chunks'] = chunks
        if not chunks:
            update['last_buffered_at_tokens'] = 0
    return current.model_copy(update=update)


def without_thread(record: OMRecord, thread_id: str, count: Callable[[str], int] | None) -> dict[str, Any]:
    """The fields of a resource-scope record, not yet reflected, without one thread: its `<thread>` sections, cursor,
    groups and chunks. A staged reflection was made from the whole log, so it goes too."""
    text = rs.remove_thread_sections(
        record.active_observations, {thread_id, rs.shown_thread_id(record.resource_id, thread_id)}
    )
    if count is not None:
        tokens = count(text)
    else:  # proportional estimate; the next observation recounts
        tokens = record.observation_tokens * len(text) // max(1, len(record.active_observations))
    return {
        'active_observations': text,
        'observation_tokens': tokens,
        'cursors': {t: c for t, c in record.cursors.items() if t != thread_id},
        'groups': tuple(g for g in record.groups if g.thread_id != thread_id),
        'archived': archive_without(record.archived, thread_id, None),
        'buffered_chunks': tuple(c for c in record.buffered_chunks if c.thread_id != thread_id),
        **NO_STAGED_REFLECTION,
    }


def archive_without(
    archived: tuple[ArchivedGroup, ...], thread_id: str, doomed: list[int] | None
) -> tuple[ArchivedGroup, ...]:
    """The archive once messages of `thread_id` are deleted (`doomed`: their numbers; None: every message of the
    thread): an archived group derived from one of them goes with it. A group whose messages are not known (no
    range) goes whenever its thread loses any message, as nothing says it was not derived from it."""

    def derived(group: ArchivedGroup) -> bool:
        if group.thread_id != thread_id:
            return False
        if doomed is None or group.start_seq is None or group.end_seq is None:
            return True
        return any(group.start_seq <= seq <= group.end_seq for seq in doomed)

    return tuple(g for g in archived if not derived(g))


def reset(writer: RecordWriter, head: OMRecord) -> OMRecord:
    """The next generation of `head` with nothing observed: every message is observed again from the start. Every
    lease goes, so work in flight on the old log never commits into the new one."""
    return writer.next_generation(
        head,
        origin='initial',
        active_observations='',
        observation_tokens=0,
        total_tokens_observed=0,
        pending_message_tokens=0,
        cursors={},
        last_observed_at=None,
        groups=(),
        # Every remaining message is observed again, archived ones included: keeping the archive would repeat them.
        archived=(),
        buffered_chunks=(),
        last_buffered_at_tokens=0,
        **NO_STAGED_REFLECTION,
        observing=None,
        reflecting=None,
        buffering_observation=None,
        buffering_reflection=None,
        reflection_stalled_at_tokens=None,
        deletions=head.deletions + 1,
    )


# ---------------------------------------------------------------------------------------------------------------------
# 2. Earlier generations
# ---------------------------------------------------------------------------------------------------------------------
class EarlierGenerations:
    """The retired generations of the thread's and the resource's memories (module docstring)."""

    def __init__(self, store: MemoryStore, count: Callable[[str], int] | None = None) -> None:
        self.store = store
        self.count = count

    def forget(self, forgotten: Forgotten) -> None:
        """Rewrite or drop every earlier generation that holds something derived from a forgotten message."""
        for key in forgotten.keys():
            head = self.store.get_record(key)
            if head is None or head.generation == 0:
                continue
            doomed: list[int] = []
            before = head.generation
            while True:
                page = self.store.list_generations(key, limit=GENERATIONS_PAGE, before=before)
                for record in page:
                    if not forgotten.touches(record):
                        continue
                    if record.scope == 'resource' and record.origin == 'initial':
                        # No reflection condensed it: the thread's sections can be cut out exactly.
                        fields = without_thread(record, forgotten.thread_id, self.count)
                        self.store.rewrite_generation(record.model_copy(update=fields))
                    else:
                        doomed.append(record.generation)
                if len(page) < GENERATIONS_PAGE:
                    break
                before = page[-1].generation
            if doomed:
                self.store.delete_generations(key, doomed)
                logger.info('earlier generations dropped', extra={'record_key': key, 'generations': len(doomed)})


# ---------------------------------------------------------------------------------------------------------------------
# 3. Vectors
# ---------------------------------------------------------------------------------------------------------------------
class MessageVectors:
    """The vector index of semantic search: the forgotten messages' vectors."""

    def __init__(self, semantic: SemanticMemory) -> None:
        self.semantic = semantic

    def forget(self, forgotten: Forgotten) -> None:
        """Remove the vectors (of the whole thread when every message went)."""
        if 'thread' not in forgotten.scopes:
            return  # an erased thread: `SemanticMemory.erase_thread` removes its vectors
        seqs: Sequence[int] | None = sorted(forgotten.seqs) if forgotten.seqs is not None else None
        self.semantic.forget_messages(forgotten.resource_id, forgotten.thread_id, forgotten.message_ids, seqs=seqs)

"""Message history of a thread (seed 003): the `recall()` query, cloning a thread, and deleting messages honestly.

Everything here works through the `MemoryStore` port, so it behaves the same on every store.

Deleting messages also removes what was derived from them, from every holder of it: `om_lib.history.forgetting` says
which holders there are and the rules for each.

Cloning carries the source's observations only when every observed group of the source lies inside the copied
messages: without per-group text the log cannot be cut to a part of the history. Imported history names no message of
the thread: it goes with the log, also when the source has no observed message.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from om_lib.config import SemanticRecallSettings
from om_lib.context import context as ctx
from om_lib.errors import InvalidInputError, ThreadNotFoundError
from om_lib.history import forgetting
from om_lib.history.semantic import SemanticMemory
from om_lib.messages import Message
from om_lib.ports import MemoryStore
from om_lib.records import ArchivedGroup, ObservationGroup, OMRecord, Thread, record_key
from om_lib.runtime.record_writer import RecordWriter

_SEQ_RANGE = re.compile(r'#(\d+):#(\d+)')

# `vectorSearchString` with vectors on but `semanticRecall` not configured: the seed's defaults.
DEFAULT_SEMANTIC_RECALL = SemanticRecallSettings(top_k=4, before=1, after=1, scope='resource')

DEFAULT_PER_PAGE = 40
# Messages read per store call while walking a thread (skipping to a page, filtering by date, cloning).
READ_CHUNK = 500
# Messages written per store call while cloning.
WRITE_CHUNK = 100


@dataclass(frozen=True)
class Include:
    """A message to include by id, with up to `with_previous` messages before it and `with_next` after it."""

    id: str
    with_previous: int = 0
    with_next: int = 0


DateRange = tuple[datetime | None, datetime | None]


def _require_thread(store: MemoryStore, resource_id: str, thread_id: str) -> Thread:
    thread = store.get_thread(resource_id, thread_id)
    if thread is None:
        raise ThreadNotFoundError(thread_id)
    return thread


def _in_range(message: Message, date_range: DateRange | None) -> bool:
    if date_range is None:
        return True
    start, end = date_range
    return (start is None or message.created_at >= start) and (end is None or message.created_at <= end)


def iter_messages(store: MemoryStore, resource_id: str, thread_id: str, *, after_seq: int = 0) -> Iterator[Message]:
    """Every message of a thread after `after_seq`, oldest first, read in chunks of `READ_CHUNK`."""
    after = after_seq
    while True:
        page = store.list_messages(resource_id, thread_id, after_seq=after, limit=READ_CHUNK)
        yield from page.messages
        if not page.has_more or not page.messages:
            return
        after = page.messages[-1].seq or after


def _page(
    store: MemoryStore, resource_id: str, thread_id: str, page: int, per_page: int | None, date_range: DateRange | None
) -> tuple[list[Message], bool]:
    if per_page == 0:
        return [], False
    if date_range is None and per_page is not None:
        # Sequence numbers have holes (deleted messages), so the offset is counted by reading forward.
        after, skip = 0, page * per_page
        while skip > 0:
            chunk = store.list_messages(resource_id, thread_id, after_seq=after, limit=min(skip, READ_CHUNK))
            if not chunk.messages:
                return [], False
            after = chunk.messages[-1].seq or after
            skip -= len(chunk.messages)
            if skip > 0 and not chunk.has_more:
                return [], False
        result = store.list_messages(resource_id, thread_id, after_seq=after, limit=per_page)
        return list(result.messages), result.has_more
    # `createdAt` is the client's time and is not indexed: a date range reads the thread and filters.
    selected = [m for m in iter_messages(store, resource_id, thread_id) if _in_range(m, date_range)]
    if per_page is None:
        return selected, False
    start = page * per_page
    return selected[start : start + per_page], len(selected) > start + per_page


def query_messages(
    store: MemoryStore,
    resource_id: str,
    thread_id: str,
    *,
    page: int = 0,
    per_page: int | None = DEFAULT_PER_PAGE,
    date_range: DateRange | None = None,
    include: Sequence[Include] | None = None,
    vector_search_string: str | None = None,
    semantic: SemanticMemory | None = None,
    semantic_recall: SemanticRecallSettings | None = None,
) -> tuple[list[Message], bool]:
    """The seed's `recall()`: one page of the thread's messages (oldest first) plus the included ones.

    `per_page=None` asks for every message, `per_page=0` for the included messages only. `date_range` filters the
    paged messages on `createdAt` (both ends inclusive, either may be None). Each `include` adds that message and up
    to `with_previous` / `with_next` neighbours (by arrival order), whatever the page and the date range; the result
    is de-duplicated and in arrival order. `has_more` is about the paged messages.

    `vector_search_string` (needs `semantic`, i.e. vectors on) adds the `topK` messages most similar to it, each with
    `messageRange` neighbours, from the thread or — scope `'resource'`, the default — from every thread of the
    resource (`semantic_recall`, else `DEFAULT_SEMANTIC_RECALL`). Messages of other threads come first (their
    `thread_id` says where they are from), then the thread's own in arrival order. Raises ThreadNotFoundError for a
    missing thread (or one of another resource) and InvalidInputError for `vector_search_string` without vectors.
    """
    if vector_search_string is not None and semantic is None:
        raise InvalidInputError(
            'vector search is not enabled: set semanticRecall or retrieval: {vector: true} to use vectorSearchString'
        )
    if page < 0:
        raise InvalidInputError('page starts at 0')
    if per_page is not None and per_page < 0:
        raise InvalidInputError('perPage must be 0 or more (or false for every message)')
    _require_thread(store, resource_id, thread_id)
    paged, has_more = _page(store, resource_id, thread_id, page, per_page, date_range)
    by_id: dict[str, Message] = {m.id: m for m in paged}
    wanted = list(include or ())
    if wanted:
        for anchor in store.get_messages(resource_id, thread_id, [i.id for i in wanted]):
            by_id[anchor.id] = anchor
            seq = anchor.seq or 0
            before = max((i.with_previous for i in wanted if i.id == anchor.id), default=0)
            after = max((i.with_next for i in wanted if i.id == anchor.id), default=0)
            if before > 0:
                older = store.list_messages(resource_id, thread_id, before_seq=seq, limit=before, newest_first=True)
                by_id.update((m.id, m) for m in older.messages)
            if after > 0:
                newer = store.list_messages(resource_id, thread_id, after_seq=seq, limit=after)
                by_id.update((m.id, m) for m in newer.messages)
    own = sorted(by_id.values(), key=lambda m: m.seq or 0)
    if vector_search_string is None or semantic is None or not vector_search_string.strip():
        return own, has_more
    recalled = semantic.recall_context(
        resource_id, thread_id, vector_search_string, semantic_recall or DEFAULT_SEMANTIC_RECALL
    )
    others = [m for m in recalled if m.thread_id not in (None, thread_id)]
    for message in recalled:
        if message.thread_id in (None, thread_id):
            by_id.setdefault(message.id, message)
    return [*others, *sorted(by_id.values(), key=lambda m: m.seq or 0)], has_more


def page_of_messages(
    store: MemoryStore, resource_id: str, thread_id: str, page: int, per_page: int, *, newest_first: bool = False
) -> tuple[list[Message], bool]:
    """Messages `page * per_page ...` in arrival order (or newest first), and whether more follow.

    Sequence numbers may have holes (deleted messages, abandoned writes), so the offset is counted by reading
    through the store's seq index in chunks; the first pages (the newest ones, newest first) read only what they show.
    """
    if not newest_first:
        return _page(store, resource_id, thread_id, page, per_page, None)
    before, skip = None, page * per_page
    while skip > 0:
        chunk = store.list_messages(
            resource_id, thread_id, before_seq=before, limit=min(skip, READ_CHUNK), newest_first=True
        )
        if not chunk.messages:
            return [], False
        before = chunk.messages[-1].seq or before
        skip -= len(chunk.messages)
        if skip > 0 and not chunk.has_more:
            return [], False
    result = store.list_messages(resource_id, thread_id, before_seq=before, limit=per_page, newest_first=True)
    return list(result.messages), result.has_more


# -- cloning ------------------------------------------------------------------------------------------------------


def clone_thread(
    store: MemoryStore,
    resource_id: str,
    source_thread_id: str,
    *,
    new_thread_id: str | None = None,
    title: str | None = None,
    metadata: dict[str, Any] | None = None,
    message_limit: int | None = None,
    date_range: DateRange | None = None,
    now: datetime,
    new_id: Callable[[], str] | None = None,
    writer: RecordWriter | None = None,
) -> tuple[Thread, list[Message]]:
    """Copy a thread's messages (optionally only those in `date_range`, then only the last `message_limit`) into a
    new thread of the same resource, and return it with the copied messages as stored.

    Copies get new ids and keep role, parts and `createdAt`. The clone's metadata is the source's (or `metadata`)
    plus `clonedFrom: {threadId, resourceId, messageCount, clonedAt, lastMessageId}`; its title defaults to
    "Clone of <source title>". The clone starts with the source's thread-scope observations when every observed group
    of the source lies inside the copied messages (see the module docstring), its cursor at the last copied message
    those groups cover; otherwise it starts without observations and the engine observes the copies afresh.

    Not atomic: the thread, its messages and its record are separate writes. A clone that fails half-way leaves a
    thread that `DELETE /threads/{id}` removes. Raises ThreadNotFoundError for the source, ThreadExistsError when
    `new_thread_id` is taken.
    """
    if message_limit is not None and message_limit < 0:
        raise InvalidInputError('messageLimit must be 0 or more')
    make_id = new_id or (lambda: str(uuid.uuid4()))
    source = _require_thread(store, resource_id, source_thread_id)
    source_messages = list(iter_messages(store, resource_id, source_thread_id))
    chosen = [m for m in source_messages if _in_range(m, date_range)]
    if message_limit is not None:
        chosen = chosen[-message_limit:] if message_limit else []
    clone_id = new_thread_id or make_id()
    cloned_from = {
        'threadId': source_thread_id,
        'resourceId': resource_id,
        'messageCount': len(chosen),
        'clonedAt': now.isoformat().replace('+00:00', 'Z'),
        'lastMessageId': chosen[-1].id if chosen else None,
    }
    clone_metadata = {**(source.metadata if metadata is None else metadata), 'clonedFrom': cloned_from}
    clone_title = title if title is not None else (f'Clone of {source.title}' if source.title else None)
    thread = store.create_thread(resource_id, clone_id, title=clone_title, metadata=clone_metadata, now=now)

    copies = [
        m.model_copy(update={'id': make_id(), 'seq': None, 'thread_id': None, 'resource_id': None}) for m in chosen
    ]
    stored: list[Message] = []
    for start in range(0, len(copies), WRITE_CHUNK):
        result = store.append_messages(resource_id, clone_id, copies[start : start + WRITE_CHUNK], now=now)
        stored.extend(result.messages)

    record = store.get_record(record_key('thread', resource_id, source_thread_id))
    carried = _carried_observations(record, source_thread_id, source_messages, chosen, stored, clone_id, make_id)
    if record is not None and carried is not None:
        groups, cursor = carried
        # Group ranges name messages by their numbers in the thread: the copies have their own.
        renumber = _renumbering(chosen, stored)
        fresh = OMRecord(
            id=make_id().replace('-', ''),
            key=record_key('thread', resource_id, clone_id),
            scope='thread',
            resource_id=resource_id,
            thread_id=clone_id,
            created_at=now,
            updated_at=now,
            active_observations=renumber_group_ranges(record.active_observations, renumber),
            observation_tokens=record.observation_tokens,
            total_tokens_observed=record.total_tokens_observed,
            cursors={clone_id: cursor},
            last_observed_at=record.last_observed_at,
            groups=groups,
            archived=tuple(_renumbered_archive(g, renumber, clone_id) for g in record.archived),
            observed_timezone=record.observed_timezone,
        )
        (writer or RecordWriter(store, _FixedClock(now), make_id)).create(fresh)
        if source.current_task or source.suggested_response:
            thread = store.update_thread(
                thread.model_copy(
                    update={'current_task': source.current_task, 'suggested_response': source.suggested_response}
                )
            )
    return thread, stored


def _renumbering(chosen: list[Message], stored: list[Message]) -> Callable[[int], int | None]:
    """Source message number → the copy's number (a deleted number maps to the next copied message)."""
    pairs = sorted((src.seq or 0, copy.seq or 0) for src, copy in zip(chosen, stored, strict=True))

    def mapped(seq: int) -> int | None:
        return next((copy for src, copy in pairs if src >= seq), None)

    return mapped


def renumber_group_ranges(text: str, renumber: Callable[[int], int | None]) -> str:
    """`text` with every `#a:#b` group range renumbered (a clone's messages have their own numbers)."""
    groups = ctx.parse_observation_groups(text)
    pieces: list[str] = []
    last = 0
    for group in groups:
        pieces.append(text[last : group.start])
        pieces.append(
            ctx.wrap_in_observation_group(
                group.content, _renumbered(group.range, renumber), group_id=group.id, kind=group.kind
            )
        )
        last = group.end
    pieces.append(text[last:])
    return ''.join(pieces)


def _renumbered(range_: str, renumber: Callable[[int], int | None]) -> str:
    match = _SEQ_RANGE.fullmatch(range_.strip())
    if match is None:
        return range_
    start, end = renumber(int(match.group(1))), renumber(int(match.group(2)))
    return ctx.group_range(start, end) if start is not None and end is not None else range_


def _renumbered_archive(group: ArchivedGroup, renumber: Callable[[int], int | None], clone_id: str) -> ArchivedGroup:
    range_ = _renumbered(group.range, renumber)
    start = renumber(group.start_seq) if group.start_seq is not None else None
    end = renumber(group.end_seq) if group.end_seq is not None else None
    return group.model_copy(update={'thread_id': clone_id, 'range': range_, 'start_seq': start, 'end_seq': end})


def _carried_observations(
    record: OMRecord | None,
    thread_id: str,
    source_messages: list[Message],
    chosen: list[Message],
    stored: list[Message],
    clone_id: str,
    make_id: Callable[[], str],
) -> tuple[tuple[ObservationGroup, ...], int] | None:
    """The clone's groups and cursor when the source's observations can be carried over whole, else None.

    Whole means: every message the source observed was copied and every observed group maps onto the copies. Imported
    history names no message of the thread, so it never stands in the way (a source with only imports, and no
    message observed, is carried with the copies unobserved).
    """
    if record is None or not record.active_observations.strip():
        return None
    # Imported history's groups name no message of the thread: they go with the log as they are.
    imports = [g.model_copy(update={'thread_id': clone_id}) for g in record.groups if g.kind == 'import']
    groups = [g for g in record.groups if g.thread_id == thread_id and g.kind != 'import']
    if len(groups) + len(imports) != len(record.groups):
        return None
    copied = {m.seq for m in chosen}
    # Messages observed before the first group's range (or between groups) but not copied are not covered below.
    observed = [m.seq for m in source_messages if (m.seq or 0) <= record.cursor(thread_id)]
    if any(seq not in copied for seq in observed):
        return None
    if not groups:
        # Only imported history, no message of the thread observed (none at all, or none yet): the log is the
        # imports', whole, and the copies start unobserved. Observations without any group cannot be placed.
        return (tuple(imports), 0) if imports and not observed else None
    clone_of = {src.seq: copy for src, copy in zip(chosen, stored, strict=True)}
    out: list[ObservationGroup] = list(imports)
    cursor = 0
    for group in sorted(groups, key=lambda g: g.start_seq):
        covered = [m.seq for m in source_messages if group.start_seq <= (m.seq or 0) <= group.end_seq]
        if not covered or any(seq not in copied for seq in covered):
            return None  # an observed message was left out: the log cannot be cut to the copied part
        first, last = clone_of[covered[0]], clone_of[covered[-1]]
        out.append(
            group.model_copy(
                update={
                    'id': make_id().replace('-', '')[:16],
                    'thread_id': clone_id,
                    'start_id': first.id,
                    'end_id': last.id,
                    'start_seq': first.seq or 0,
                    'end_seq': last.seq or 0,
                }
            )
        )
        cursor = max(cursor, last.seq or 0)
    return tuple(out), cursor


# -- deleting -----------------------------------------------------------------------------------------------------


def forget_messages(
    store: MemoryStore,
    resource_id: str,
    thread_id: str,
    message_ids: Sequence[str] | None,
    *,
    now: datetime,
    new_id: Callable[[], str] | None = None,
    count: Callable[[str], int] | None = None,
    writer: RecordWriter | None = None,
    semantic: SemanticMemory | None = None,
) -> int:
    """Delete messages by id (`None`: clear the thread), then what was derived from them (`om_lib.history.forgetting`):
    in the thread's and the resource's memory, every earlier generation of both, and the vectors (with `semantic`).

    `count` counts observation tokens (the engine's counter) for a resource log that keeps other threads' sections;
    `writer` is the engine's record writer (records change only through one).

    Returns how many messages were deleted. Raises ThreadNotFoundError for a missing thread or one of another
    resource.
    """
    writer = writer or RecordWriter(store, _FixedClock(now), new_id or (lambda: uuid.uuid4().hex))
    _require_thread(store, resource_id, thread_id)
    if message_ids is None:
        seqs: frozenset[int] | None = None
    else:
        seqs = frozenset(m.seq or 0 for m in store.get_messages(resource_id, thread_id, message_ids))
    deleted = store.delete_messages(resource_id, thread_id, message_ids)
    if seqs is not None and not seqs:
        return deleted  # none of them was stored: nothing was derived from them
    forgotten = forgetting.Forgotten(
        resource_id, thread_id, tuple(message_ids) if message_ids is not None else None, seqs, now
    )
    forgetting.forget(forgetting.holders(writer, count=count, semantic=semantic), forgotten)
    return deleted


def erase_thread_from_resource_memory(
    store: MemoryStore,
    resource_id: str,
    thread_id: str,
    *,
    now: datetime,
    count: Callable[[str], int] | None = None,
    writer: RecordWriter | None = None,
) -> bool:
    """After a thread is erased: its sections and cursor leave the resource's memory and its earlier generations (the
    thread's own memory, its messages and its vectors went with the thread). True when the live memory had some."""
    writer = writer or RecordWriter(store, _FixedClock(now), lambda: uuid.uuid4().hex)
    forgotten = forgetting.Forgotten(resource_id, thread_id, None, None, now, scopes=('resource',))
    head = store.get_record(forgotten.keys()[0])
    had = head is not None and forgotten.observed_by(head)
    forgetting.forget(forgetting.holders(writer, count=count), forgotten)
    return had


class _FixedClock:
    """A clock for history operations called without the engine's: `now` as given, monotonic from the OS."""

    def __init__(self, now: datetime) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        import time

        return time.monotonic()

"""The `recall` tool (seed 000 "Recall tool", spec §18.3): page through the raw messages behind observation groups.

Pure over the store: `recall(store, counter, ...)` answers exactly the seed's returns (camelCase keys) for
`mode: "messages"` (paging from a cursor or from the start of a thread, low/high detail, `partIndex`, the token
budget), `mode: "threads"` (the resource's threads, newest activity first) and `mode: "search"` (messages by
semantic similarity to `query`, grouped by thread; needs `retrieval: {vector: true}` and a `SemanticMemory`).

Paging follows the store's arrival order (`seq`), not client clocks. Scope `'thread'` keeps the tool inside the
current thread; scope `'resource'` (the default) lets it list and browse every thread of the caller's resource and
never anything of another resource. Invalid input raises `InvalidInputError` with a message written for the model
(the chat tool loop hands it back as `{error: message}`, the API answers 422).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, cast

from om_lib.config import RetrievalSettings
from om_lib.context.tokens import TokenCounter
from om_lib.errors import InvalidInputError
from om_lib.history.semantic import SearchResult, SemanticMemory
from om_lib.history.threads import list_resource_threads
from om_lib.llm import FunctionDeclaration
from om_lib.messages import (
    FilePart,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    time_of,
)
from om_lib.observation.resource_scope import ThreadIdCodec
from om_lib.ports import MemoryStore
from om_lib.prompts.observer import format_tool_result
from om_lib.reflection.archive import page_archive

Mode = Literal['messages', 'threads', 'search', 'observations']
Detail = Literal['low', 'high']
RecallScope = Literal['thread', 'resource']

DEFAULT_MAX_TOKENS = 8000
DEFAULT_LIMIT = 20
MAX_LIMIT = 50
LOW_DETAIL_TEXT_LIMIT = 120
LOW_DETAIL_TOOL_RESULT_TOKENS = 60
HIGH_DETAIL_TOOL_RESULT_TOKENS = 4000
# Messages read per store call while paging or looking a cursor up.
_READ_CHUNK = 200
# Threads searched when a cursor is not in the thread it was looked up in.
_MAX_THREADS_SEARCHED = 100

SEARCH_UNAVAILABLE = 'semantic search needs retrieval: {vector: true}'
DEFAULT_SEARCH_LIMIT = 10

_MODES = ('messages', 'threads', 'search', 'observations')
# `#12`: a message by its number in the thread (`#` never occurs in a message id).
_MESSAGE_NUMBER = re.compile(r'#(\d{1,18})')
_DETAILS = ('low', 'high')


# ---------------------------------------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecallRequest:
    """One recall call: the seed's parameters (snake_case).

    Attributes:
        mode: `'messages'` (default), `'threads'`, `'search'` or `'observations'` (the archive).
        query: The search text (`mode: "search"`), or the words archived groups must hold (`"observations"`).
        cursor: A message id to page from (or a whole `a:b` range, which answers a hint).
        thread_id: Another thread of the resource to browse (scope `'resource'`).
        page: Messages: positive forward, negative backward, 0 means 1 (default 1). Threads: from 0 (default 0).
        limit: Items per page (default 20, at most 50).
        detail: `'low'` (default) or `'high'`.
        part_index: Fetch one part of the cursor message at full detail.
        before: Threads mode: created before this ISO 8601 date.
        after: Threads mode: created after this ISO 8601 date.
    """

    mode: Mode = 'messages'
    query: str | None = None
    cursor: str | None = None
    thread_id: str | None = None
    page: int | None = None
    limit: int | None = None
    detail: Detail = 'low'
    part_index: int | None = None
    before: str | None = None
    after: str | None = None

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> RecallRequest:
        """A request from the tool's JSON arguments (camelCase, as the model sends them); unknown keys are ignored.

        Raises:
            InvalidInputError: A value has the wrong type or is out of range.
        """
        mode = args.get('mode') or 'messages'
        if mode not in _MODES:
            raise InvalidInputError(
                f'mode must be one of "messages", "threads", "search", "observations" (got {mode!r})'
            )
        detail = args.get('detail') or 'low'
        if detail not in _DETAILS:
            raise InvalidInputError(f'detail must be "low" or "high" (got {detail!r})')
        limit = _int_arg(args, 'limit')
        if limit is not None and limit < 1:
            raise InvalidInputError('limit must be a positive number')
        part_index = _int_arg(args, 'partIndex')
        if part_index is not None and part_index < 0:
            raise InvalidInputError('partIndex must be 0 or more')
        return cls(
            mode=cast(Mode, mode),
            query=_str_arg(args, 'query'),
            cursor=_str_arg(args, 'cursor'),
            thread_id=_str_arg(args, 'threadId'),
            page=_int_arg(args, 'page'),
            limit=limit,
            detail=cast(Detail, detail),
            part_index=part_index,
            before=_str_arg(args, 'before'),
            after=_str_arg(args, 'after'),
        )


def _str_arg(args: Mapping[str, Any], name: str) -> str | None:
    value = args.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f'{name} must be a string')
    return value.strip() or None


def _int_arg(args: Mapping[str, Any], name: str) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    # JSON numbers from a model may arrive as floats (1.0); only whole numbers are accepted.
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise InvalidInputError(f'{name} must be a whole number')
    return int(value)


# ---------------------------------------------------------------------------------------------------------------------
# Tool declaration
# ---------------------------------------------------------------------------------------------------------------------
_PARAMETERS: dict[str, Any] = {
    'type': 'object',
    'properties': {
        'mode': {
            'type': 'string',
            'enum': list(_MODES),
            'description': (
                'What to retrieve. "messages" (default) pages through message history. "threads" lists all threads '
                'for the current user. "search" finds messages by semantic similarity across all threads. '
                '"observations" pages through archived observations, newest first (with `query`: those holding all '
                'its words).'
            ),
        },
        'query': {
            'type': 'string',
            'description': 'Search query for mode "search"; words every archived group must hold for "observations".',
        },
        'cursor': {
            'type': 'string',
            'description': (
                'Where to start reading: one end of an observation section\'s range (`#12` from "## Messages '
                '#12–#19": the message with that number in the conversation), or a message ID from a recall answer. '
                'Can be omitted when threadId is given, to read from the beginning of that thread.'
            ),
        },
        'threadId': {
            'type': 'string',
            'description': 'Browse a different thread by its ID. Use mode "threads" first to discover thread IDs.',
        },
        'page': {
            'type': 'integer',
            'description': (
                'Pagination offset. For messages: positive values page forward from the cursor, negative values '
                'page backward; 0 is treated as 1. For threads and observations: page number, from 0.'
            ),
        },
        'limit': {'type': 'integer', 'description': 'Maximum number of items per page (default 20).'},
        'detail': {
            'type': 'string',
            'enum': list(_DETAILS),
            'description': (
                '"low" (default) shows truncated text and tool names with part indices [p0], [p1]. "high" shows '
                'full content including tool arguments and results, one part per call with continuation hints.'
            ),
        },
        'partIndex': {
            'type': 'integer',
            'description': 'Fetch a single part of the cursor message at full detail by its index ([p1] → 1).',
        },
        'before': {
            'type': 'string',
            'description': 'For mode "threads": only threads created before this ISO 8601 date (e.g. "2026-03-15").',
        },
        'after': {
            'type': 'string',
            'description': 'For mode "threads": only threads created after this ISO 8601 date (e.g. "2026-03-01").',
        },
    },
}

_DESCRIPTION_RESOURCE = (
    'Browse raw conversation history behind your observations. Use mode "messages" (default) with a cursor (a '
    'message ID from an observation group range) to page through messages, or with threadId to read another '
    'thread of this user. Use mode "threads" to list the user\'s threads.'
)
_DESCRIPTION_THREAD = (
    'Browse raw message history of the current conversation behind your observations. Pass a cursor (the start or '
    'end message ID of an observation group range) and page forward or backward. Use detail "high" or partIndex '
    'for full content.'
)


_DESCRIPTION_SEARCH = (
    ' Use mode "search" with a query to find messages by meaning (not only by keywords); each result gives a '
    'cursor to read around it.'
)


def recall_tool(scope: RecallScope = 'resource', *, vector: bool = False) -> FunctionDeclaration:
    """The `recall` declaration offered to the Actor (thread scope leaves out cross-thread parameters; `search` is
    described when `vector` search is on)."""
    search = _DESCRIPTION_SEARCH if vector else ''
    if scope == 'resource':
        return FunctionDeclaration(name='recall', description=_DESCRIPTION_RESOURCE + search, parameters=_PARAMETERS)
    properties = {k: v for k, v in _PARAMETERS['properties'].items() if k not in ('threadId', 'before', 'after')}
    return FunctionDeclaration(
        name='recall', description=_DESCRIPTION_THREAD + search, parameters={'type': 'object', 'properties': properties}
    )


RECALL_TOOL = recall_tool('resource')


def declaration_json(declaration: FunctionDeclaration) -> dict[str, Any]:
    """A declaration as the API lists it in a step's `tools`: `{name, description, parameters}` (JSON Schema)."""
    return {'name': declaration.name, 'description': declaration.description, 'parameters': declaration.parameters}


def step_tools(retrieval: RetrievalSettings | None) -> list[dict[str, Any]]:
    """A step's `tools` (`POST /threads/{threadId}/steps`): the recall declaration when retrieval is on."""
    return [declaration_json(recall_tool(retrieval.scope, vector=retrieval.vector))] if retrieval is not None else []


# ---------------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------------
def recall(
    store: MemoryStore,
    counter: TokenCounter,
    *,
    resource_id: str,
    current_thread_id: str,
    request: RecallRequest,
    scope: RecallScope = 'resource',
    max_tokens: int = DEFAULT_MAX_TOKENS,
    semantic: SemanticMemory | None = None,
    obscure_thread_ids: bool = False,
    memory_key: str | None = None,
) -> dict[str, Any]:
    """Run one recall call and return the seed's returns for its mode (camelCase keys).

    Args:
        store: Where threads and messages live.
        counter: Counts tokens for the output budget.
        resource_id: The caller's resource; nothing outside it is ever read.
        current_thread_id: The thread the agent is in (marked `← current`; the only one in thread scope).
        request: The call's parameters.
        scope: `'resource'` (browse every thread of the resource) or `'thread'` (the current thread only).
        max_tokens: Output budget; longer output is cut and flagged `truncated`.
        semantic: Semantic search (mode "search"); None when `retrieval.vector` is off.
        obscure_thread_ids: The model sees hashed thread ids (`obscureThreadIds`): answers show them, and a
            `threadId` it passes back is resolved to the real thread of this resource.
        memory_key: The key of the observational memory the Actor reads (`mode: "observations"` pages its archive).

    Raises:
        InvalidInputError: A bad cursor, thread, index, date or mode, with a message for the model.
    """
    codec = ThreadIdCodec(resource_id, obscure_thread_ids)
    if obscure_thread_ids and request.thread_id:
        request = replace(request, thread_id=_real_thread_id(store, codec, request.thread_id))
    if request.mode == 'search':
        if semantic is None:
            raise InvalidInputError(SEARCH_UNAVAILABLE)
        return _search(semantic, counter, resource_id, current_thread_id, request, scope, max_tokens, codec.shown)
    if request.mode == 'threads':
        return _list_threads(store, resource_id, current_thread_id, request, scope, codec.shown)
    if request.mode == 'observations':
        return _archived(store, counter, memory_key, current_thread_id, request, scope, max_tokens, codec.shown)
    return _messages(store, counter, resource_id, current_thread_id, request, scope, max_tokens, codec.shown)


def _real_thread_id(store: MemoryStore, codec: ThreadIdCodec, shown: str) -> str:
    """The resource's thread behind a shown id (unknown ids pass through and are refused as missing later)."""
    if store.get_thread(codec.resource_id, shown) is not None:
        return shown
    threads, _ = list_resource_threads(store, codec.resource_id, per_page=None)
    return codec.resolve(shown, (t.id for t in threads)) or shown


# ---------------------------------------------------------------------------------------------------------------------
# Search mode
# ---------------------------------------------------------------------------------------------------------------------
def _search(
    semantic: SemanticMemory,
    counter: TokenCounter,
    resource_id: str,
    current_thread_id: str,
    request: RecallRequest,
    scope: RecallScope,
    max_tokens: int,
    show: Callable[[str], str] = str,
) -> dict[str, Any]:
    query = (request.query or '').strip()
    if not query:
        raise InvalidInputError('query is required for mode="search": describe what you are looking for')
    limit = min(request.limit or DEFAULT_SEARCH_LIMIT, MAX_LIMIT)
    results = semantic.search(resource_id, query, current_thread_id=current_thread_id, scope=scope, top_k=limit)
    if not results:
        return {'results': 'No matching messages found.', 'count': 0}
    text, _, _ = _budget(
        _render_results(semantic, counter, resource_id, current_thread_id, results, show), max_tokens, counter
    )
    return {'results': text, 'count': len(results)}


def _render_results(
    semantic: SemanticMemory,
    counter: TokenCounter,
    resource_id: str,
    current_thread_id: str,
    results: Sequence[SearchResult],
    show: Callable[[str], str] = str,
) -> str:
    """Results grouped by thread (best thread first): title, id, then score, preview and cursor per message."""
    groups: dict[str, list[SearchResult]] = {}
    for result in results:
        groups.setdefault(result.message.thread_id or current_thread_id, []).append(result)
    lines: list[str] = []
    for thread_id, hits in groups.items():
        thread = semantic.store.get_thread(resource_id, thread_id)
        title = (thread.title if thread else None) or '(untitled)'
        marker = ' ← current' if thread_id == current_thread_id else ''
        if lines:
            lines.append('')
        lines.append(f'### {title}{marker}')
        lines.append(f'threadId: {show(thread_id)}')
        for hit in hits:
            message = hit.message
            preview = ' '.join(p.text for p in format_message_parts(message, 'low', counter)) or '(no text)'
            lines.append(
                f'- score {hit.score:.2f} | {message.role} ({_timestamp(time_of(message))}) | '
                f'cursor="{message.id}": {preview}'
            )
    return '\n'.join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Observations mode (the archive)
# ---------------------------------------------------------------------------------------------------------------------
def _archived(
    store: MemoryStore,
    counter: TokenCounter,
    memory_key: str | None,
    current_thread_id: str,
    request: RecallRequest,
    scope: RecallScope,
    max_tokens: int,
    show: Callable[[str], str],
) -> dict[str, Any]:
    page = request.page or 0
    if page < 0:
        raise InvalidInputError('page must be 0 or more for mode "observations" (pages count from 0, newest first)')
    record = store.get_record(memory_key) if memory_key else None
    archived = list(record.archived) if record is not None else []
    if scope == 'thread':
        # Resource-scope memory shared by every thread: the thread-scoped tool reads this thread's groups only.
        archived = [g for g in archived if g.thread_id in (None, current_thread_id)]
    return page_archive(
        archived,
        query=request.query,
        page=page,
        limit=_limit(request.limit),
        count=counter.count_string,
        max_tokens=max_tokens,
        show_thread=show,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Threads mode
# ---------------------------------------------------------------------------------------------------------------------
def _list_threads(
    store: MemoryStore,
    resource_id: str,
    current_thread_id: str,
    request: RecallRequest,
    scope: RecallScope,
    show: Callable[[str], str] = str,
) -> dict[str, Any]:
    page = request.page or 0
    if page < 0:
        raise InvalidInputError('page must be 0 or more for mode "threads" (pages count from 0)')
    limit = _limit(request.limit)
    before = _parse_date(request.before, 'before')
    after = _parse_date(request.after, 'after')
    if scope == 'thread':
        current = store.get_thread(resource_id, current_thread_id)
        threads = [current] if current is not None else []
    else:
        threads, _ = list_resource_threads(store, resource_id, per_page=None, order_by='updatedAt', direction='DESC')
    if before is not None:
        threads = [t for t in threads if t.created_at < before]
    if after is not None:
        threads = [t for t in threads if t.created_at > after]
    start = page * limit
    shown = threads[start : start + limit]
    if not shown:
        return {'threads': 'No threads found matching the criteria.', 'count': 0, 'page': page, 'hasMore': False}
    lines: list[str] = []
    for thread in shown:
        marker = ' ← current' if thread.id == current_thread_id else ''
        lines.append(f'- **{thread.title or "(untitled)"}**{marker}')
        lines.append(f'  id: {show(thread.id)}')
        lines.append(f'  updated: {_timestamp(thread.updated_at)} | created: {_timestamp(thread.created_at)}')
    return {'threads': '\n'.join(lines), 'count': len(shown), 'page': page, 'hasMore': len(threads) > start + limit}


def _parse_date(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + '+00:00' if text.endswith(('Z', 'z')) else text)
    except ValueError:
        raise InvalidInputError(
            f'{name} must be an ISO 8601 date such as "2026-03-15" or "2026-03-10T00:00:00Z" (got {value!r})'
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _limit(value: int | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    if value < 1:
        raise InvalidInputError('limit must be a positive number')
    return min(value, MAX_LIMIT)


# ---------------------------------------------------------------------------------------------------------------------
# Messages mode
# ---------------------------------------------------------------------------------------------------------------------
def _messages(
    store: MemoryStore,
    counter: TokenCounter,
    resource_id: str,
    current_thread_id: str,
    request: RecallRequest,
    scope: RecallScope,
    max_tokens: int,
    show: Callable[[str], str] = str,
) -> dict[str, Any]:
    cursor = request.cursor
    if not cursor and not request.thread_id:
        raise InvalidInputError('Either cursor or threadId is required for mode="messages"')
    target = _target_thread(store, resource_id, current_thread_id, request.thread_id, scope)
    if not cursor:
        if request.part_index is not None:
            raise InvalidInputError('partIndex needs a cursor: the ID of the message whose part you want')
        return _from_start(store, counter, resource_id, target, request, max_tokens)

    range_ids = parse_range(cursor)
    if range_ids is not None:
        hint = (
            f'The cursor "{cursor}" looks like a range. Use one of the individual message IDs as the cursor '
            f'instead: start="{range_ids[0]}" or end="{range_ids[1]}".'
        )
        if request.part_index is not None:
            raise InvalidInputError(hint)
        page = _message_page(request.page)
        return _messages_result(hint, 0, cursor, page, _limit(request.limit), request.detail, False, False, False, 0)

    anchor = _resolve_cursor(
        store, resource_id, target, cursor, scope, explicit_thread=request.thread_id is not None, show=show
    )
    if request.part_index is not None:
        return _part(counter, anchor, cursor, request.part_index, max_tokens)
    return _from_cursor(store, counter, resource_id, anchor, cursor, request, max_tokens)


def _target_thread(
    store: MemoryStore, resource_id: str, current_thread_id: str, thread_id: str | None, scope: RecallScope
) -> str:
    if not thread_id or thread_id == current_thread_id:
        return current_thread_id
    if scope == 'thread':
        raise InvalidInputError(
            'recall is limited to the current thread (retrieval scope "thread"); browse it with a cursor instead'
        )
    if store.get_thread(resource_id, thread_id) is None:
        raise InvalidInputError(f'Thread {thread_id} was not found. Use mode="threads" to list the available threads.')
    return thread_id


def parse_range(cursor: str) -> tuple[str, str] | None:
    """`(startId, endId)` when `cursor` looks like a range (`a:b` or a comma list of ranges), else None."""
    text = cursor.strip()
    if ',' in text:
        pieces = [p.strip() for p in text.split(',') if p.strip()]
        if pieces:
            first, last = pieces[0], pieces[-1]
            start = first[: first.index(':')] if first.find(':') > 0 else first
            end = last[last.index(':') + 1 :] if last.find(':') > 0 else last
            return start, end
    colon = text.find(':')
    if 0 < colon < len(text) - 1:
        return text[:colon], text[colon + 1 :]
    return None


def _resolve_cursor(
    store: MemoryStore,
    resource_id: str,
    thread_id: str,
    cursor: str,
    scope: RecallScope,
    *,
    explicit_thread: bool,
    show: Callable[[str], str] = str,
) -> Message:
    """The cursor's message within the allowed scope; never a message of another resource.

    `#12` (a range end as the Actor sees it) is the thread's message number 12, or the first one after it when that
    message was deleted."""
    message_id = cursor.strip()
    number = _MESSAGE_NUMBER.fullmatch(message_id)
    if number is not None:
        page = store.list_messages(resource_id, thread_id, after_seq=int(number.group(1)) - 1, limit=1)
        if not page.messages:
            raise InvalidInputError(f'Could not resolve cursor message: {cursor} (no such message in the thread)')
        return page.messages[0]
    found = find_message(store, resource_id, thread_id, message_id)
    if found is not None:
        return found
    elsewhere = _find_in_other_threads(store, resource_id, thread_id, message_id)
    if elsewhere is None:
        raise InvalidInputError(f'Could not resolve cursor message: {cursor}')
    if scope == 'thread':
        raise InvalidInputError('The requested cursor does not belong to the current thread')
    if explicit_thread:
        raise InvalidInputError(
            f'The cursor "{cursor}" does not belong to thread {show(thread_id)}; it is in thread '
            f'{show(elsewhere.thread_id or "")}. '
            'Pass that threadId, or leave threadId out.'
        )
    return elsewhere


def find_message(store: MemoryStore, resource_id: str, thread_id: str, message_id: str) -> Message | None:
    """One message of a thread by id, or None (also for another resource's thread).

    Uses the store's id lookup when it has one, else pages through the thread.
    """
    get_messages = getattr(store, 'get_messages', None)
    if callable(get_messages):
        result = get_messages(resource_id, thread_id, [message_id])
        messages = getattr(result, 'messages', result)
        return next((m for m in messages if m.id == message_id), None)
    after = 0
    while True:
        page = store.list_messages(resource_id, thread_id, after_seq=after, limit=_READ_CHUNK)
        for message in page.messages:
            if message.id == message_id:
                return message
        if not page.has_more or not page.messages:
            return None
        after = page.messages[-1].seq or after


def _find_in_other_threads(store: MemoryStore, resource_id: str, skip: str, message_id: str) -> Message | None:
    listing = store.list_threads(resource_id, limit=_MAX_THREADS_SEARCHED)
    for thread in listing.threads:
        if thread.id == skip:
            continue
        found = find_message(store, resource_id, thread.id, message_id)
        if found is not None:
            return found if found.thread_id else found.model_copy(update={'thread_id': thread.id})
    return None


def _message_page(page: int | None) -> int:
    return 1 if not page else page


def _read_visible(
    store: MemoryStore, resource_id: str, thread_id: str, *, after_seq: int, before_seq: int | None, want: int
) -> list[Message]:
    """Up to `want` messages with visible parts, walking from the anchor (forward, or backward when `before_seq`)."""
    backward = before_seq is not None
    collected: list[Message] = []
    after, before = after_seq, before_seq
    while len(collected) < want:
        page = store.list_messages(
            resource_id,
            thread_id,
            after_seq=after,
            before_seq=before,
            limit=min(_READ_CHUNK, want - len(collected)),
            newest_first=backward,
        )
        collected.extend(m for m in page.messages if _visible(m))
        if not page.has_more or not page.messages:
            break
        if backward:
            before = page.messages[-1].seq
        else:
            after = page.messages[-1].seq or after
    return collected[:want]


def _from_cursor(
    store: MemoryStore,
    counter: TokenCounter,
    resource_id: str,
    anchor: Message,
    cursor: str,
    request: RecallRequest,
    max_tokens: int,
) -> dict[str, Any]:
    page = _message_page(request.page)
    limit = _limit(request.limit)
    forward = page > 0
    page_index = max(abs(page), 1) - 1
    skip = page_index * limit
    thread_id = anchor.thread_id or ''
    seq = anchor.seq or 0
    want = skip + limit + 1
    if forward:
        visible = _read_visible(store, resource_id, thread_id, after_seq=seq, before_seq=None, want=want)
        window = visible[skip : skip + limit]
    else:
        visible = _read_visible(store, resource_id, thread_id, after_seq=0, before_seq=seq, want=want)
        window = list(reversed(visible[skip : skip + limit]))
    has_more = len(visible) > skip + limit
    has_next = has_more if forward else page_index > 0
    has_prev = page_index > 0 if forward else has_more
    return _render_page(counter, window, cursor, page, limit, request.detail, has_next, has_prev, max_tokens)


def _from_start(
    store: MemoryStore,
    counter: TokenCounter,
    resource_id: str,
    thread_id: str,
    request: RecallRequest,
    max_tokens: int,
) -> dict[str, Any]:
    page = max(request.page or 1, 1)
    limit = _limit(request.limit)
    skip = (page - 1) * limit
    visible = _read_visible(store, resource_id, thread_id, after_seq=0, before_seq=None, want=skip + limit + 1)
    window = visible[skip : skip + limit]
    has_next = len(visible) > skip + limit
    cursor = window[0].id if window else ''
    result = _render_page(counter, window, cursor, page, limit, request.detail, has_next, page > 1, max_tokens)
    if not window:
        result['messages'] = '(no messages in this thread)' if page == 1 else '(no messages on this page)'
    return result


def _render_page(
    counter: TokenCounter,
    window: Sequence[Message],
    cursor: str,
    page: int,
    limit: int,
    detail: Detail,
    has_next: bool,
    has_prev: bool,
    max_tokens: int,
) -> dict[str, Any]:
    parts = [p for m in window for p in format_message_parts(m, detail, counter)]
    if detail == 'high' and parts:
        first = parts[0]
        same = [p for p in parts if p.message.id == first.message.id]
        others = [p for p in parts if p.message.id != first.message.id]
        text, truncated, offset = _budget(render_parts([first]), max_tokens, counter)
        hints: list[str] = []
        if len(same) > 1:
            hints.append(f'next part: partIndex={same[1].index} on cursor="{first.message.id}"')
        if others:
            hints.append(f'next message: partIndex={others[0].index} on cursor="{others[0].message.id}"')
        elif has_next:
            hints.append(f'more messages available on page {page + 1}')
        if hints:
            text += f'\n\nHigh detail returns 1 part at a time. To continue: {", or ".join(hints)}.'
        return _messages_result(
            text, 1, cursor, page, limit, detail, bool(others) or has_next, has_prev, truncated, offset
        )
    text, truncated, offset = _budget(render_parts(parts), max_tokens, counter)
    if not window:
        text = 'No messages on this page.'
    return _messages_result(text, len(window), cursor, page, limit, detail, has_next, has_prev, truncated, offset)


def _messages_result(
    text: str,
    count: int,
    cursor: str,
    page: int,
    limit: int,
    detail: Detail,
    has_next: bool,
    has_prev: bool,
    truncated: bool,
    token_offset: int,
) -> dict[str, Any]:
    return {
        'messages': text,
        'count': count,
        'cursor': cursor,
        'page': page,
        'limit': limit,
        'detail': detail,
        'hasNextPage': has_next,
        'hasPrevPage': has_prev,
        'truncated': truncated,
        'tokenOffset': token_offset,
    }


def _part(counter: TokenCounter, message: Message, cursor: str, part_index: int, max_tokens: int) -> dict[str, Any]:
    parts = format_message_parts(message, 'high', counter)
    if not parts:
        raise InvalidInputError(
            f'Message {cursor} has no visible content (it may be an internal system message). '
            'Try a neighboring message ID instead.'
        )
    target = next((p for p in parts if p.index == part_index), None)
    if target is None:
        available = ', '.join(str(p.index) for p in parts)
        raise InvalidInputError(
            f'Part index {part_index} not found in message {cursor}. Available indices: {available}'
        )
    text, truncated, _ = _budget(target.text, max_tokens, counter)
    return {
        'text': text,
        'messageId': message.id,
        'partIndex': target.index,
        'role': message.role,
        'type': target.type,
        'truncated': truncated,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormattedPart:
    """One visible part of a message, rendered for recall."""

    message: Message
    index: int
    type: str
    text: str


def format_message_parts(message: Message, detail: Detail, counter: TokenCounter) -> list[FormattedPart]:
    """The message's visible parts at `detail`, each with its position in `message.parts`."""
    out: list[FormattedPart] = []
    for index, part in enumerate(message.parts):
        hint = f'call recall cursor="{message.id}" partIndex={index} detail="high" for full content'
        if isinstance(part, TextPart):
            out.append(FormattedPart(message, index, 'text', _low(part.text, hint) if detail == 'low' else part.text))
        elif isinstance(part, ReasoningPart):
            if part.text:
                text = _low(part.text, hint) if detail == 'low' else part.text
                out.append(FormattedPart(message, index, 'reasoning', text))
        elif isinstance(part, ToolResultPart):
            if detail == 'low':
                body = format_tool_result(
                    part.result, max_tokens=LOW_DETAIL_TOOL_RESULT_TOKENS, count=counter.count_string
                )
                text = f'[Tool Result: {part.tool_name}] {_low(body, hint)}'
            else:
                body = format_tool_result(
                    part.result, max_tokens=HIGH_DETAIL_TOOL_RESULT_TOKENS, count=counter.count_string
                )
                text = f'[Tool Result: {part.tool_name}]\n{body}'
            out.append(FormattedPart(message, index, 'tool-result', text))
        elif isinstance(part, ToolCallPart):
            text = f'[Tool Call: {part.tool_name}]'
            if detail == 'high':
                text += '\n' + json.dumps(part.args, indent=2, ensure_ascii=False, default=str)
            out.append(FormattedPart(message, index, 'tool-call', text))
        elif isinstance(part, ImagePart | FilePart):
            label = 'Image' if isinstance(part, ImagePart) else 'File'
            name = f': {part.filename}' if part.filename else ''
            out.append(FormattedPart(message, index, part.type, f'[{label}{name}]'))
        else:
            kind = str(getattr(part, 'type', 'unknown'))
            if not kind.startswith('data-'):
                out.append(FormattedPart(message, index, kind, f'[{kind}]'))
    return out


def render_parts(parts: Sequence[FormattedPart]) -> str:
    """`**role (YYYY-MM-DD HH:MM:SSZ)** [id]:` per message, then `  [p<i>] text` per part; messages blank-separated."""
    lines: list[str] = []
    current = None
    for part in parts:
        if part.message.id != current:
            current = part.message.id
            if lines:
                lines.append('')
            lines.append(f'**{part.message.role} ({_timestamp(time_of(part.message))})** [{part.message.id}]:')
        lines.append(f'  [p{part.index}] {part.text}')
    return '\n'.join(lines)


def _visible(message: Message) -> bool:
    return any(
        not isinstance(p, ReasoningPart) or p.text
        for p in message.parts
        if not str(getattr(p, 'type', '')).startswith('data-')
    )


def _low(text: str, hint: str) -> str:
    if len(text) <= LOW_DETAIL_TEXT_LIMIT:
        return text
    return f'{text[:LOW_DETAIL_TEXT_LIMIT]}… [truncated — {hint}]'


def _budget(text: str, max_tokens: int, counter: TokenCounter) -> tuple[str, bool, int]:
    """`(text, truncated, tokenOffset)`: the text cut to `max_tokens` with a `... [truncated ~K tokens]` suffix."""
    total = counter.count_string(text)
    if total <= max_tokens:
        return text, False, 0
    lo, hi = 0, min(len(text), max(max_tokens, 1) * 32)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.count_string(text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    kept = text[:lo]
    return f'{kept}\n... [truncated ~{total - counter.count_string(kept)} tokens]', True, total - max_tokens


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%SZ')

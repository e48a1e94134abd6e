"""The recall tool (om_lib/history/recall.py) over the in-memory store with a word-count tokenizer (spec §18.3, §25
L60-L64)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.conversation.chat import MAX_TOOL_ROUNDS
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import InvalidInputError
from om_lib.history.recall import RECALL_TOOL, RecallRequest, recall, recall_tool
from om_lib.llm import FunctionCall, ModelRequest, ModelResponse
from om_lib.messages import Message, ToolCallPart
from om_lib.models.model_router import ModelRouter
from om_lib.service import MemoryService

RES, THREAD, OTHER = 'r1', 'th1', 'th2'
T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


class WordTokenizer:
    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


COUNTER = TokenCounter(WordTokenizer())


def msg(mid: str, minute: int, role: str = 'user', **body: Any) -> Message:
    if 'parts' not in body:
        body.setdefault('content', f'message {mid}')
    return Message.model_validate({'id': mid, 'role': role, 'createdAt': (T0 + timedelta(minutes=minute)), **body})


@pytest.fixture
def store() -> InMemoryStore:
    s = InMemoryStore()
    s.append_messages(RES, THREAD, [msg(f'm{i}', i, 'user' if i % 2 == 0 else 'assistant') for i in range(8)], now=T0)
    return s


def run(store: InMemoryStore, scope: str = 'resource', thread: str = THREAD, **args: Any) -> dict[str, Any]:
    return recall(
        store,
        COUNTER,
        resource_id=RES,
        current_thread_id=thread,
        request=RecallRequest.from_args(args),
        scope=scope,  # type: ignore[arg-type]
    )


def ids_in(text: str) -> list[str]:
    return [line.split('[', 1)[1].split(']', 1)[0] for line in text.splitlines() if line.startswith('**')]


# -- L60: a whole range as the cursor ------------------------------------------------------------------------------
def test_range_cursor_answers_the_hint_with_count_zero(store: InMemoryStore) -> None:
    result = run(store, cursor='m1:m4')

    assert result['count'] == 0
    assert 'start="m1"' in result['messages'] and 'end="m4"' in result['messages']
    assert (result['hasNextPage'], result['hasPrevPage'], result['truncated'], result['tokenOffset']) == (
        False,
        False,
        False,
        0,
    )
    merged = run(store, cursor='m1:m2,m5:m6')
    assert 'start="m1"' in merged['messages'] and 'end="m6"' in merged['messages']
    with pytest.raises(InvalidInputError, match='looks like a range'):
        run(store, cursor='m1:m4', partIndex=0)


# -- L61: cursors that do not resolve ------------------------------------------------------------------------------
def test_unknown_cursor_is_refused(store: InMemoryStore) -> None:
    with pytest.raises(InvalidInputError, match='Could not resolve cursor message: nope'):
        run(store, cursor='nope')


def test_cursor_of_another_thread_is_refused_in_thread_scope(store: InMemoryStore) -> None:
    store.append_messages(RES, OTHER, [msg('x1', 30)], now=T0)

    with pytest.raises(InvalidInputError, match='does not belong to the current thread'):
        run(store, scope='thread', cursor='x1')
    with pytest.raises(InvalidInputError, match='limited to the current thread'):
        run(store, scope='thread', threadId=OTHER)


def test_cursor_of_another_resource_never_resolves(store: InMemoryStore) -> None:
    store.append_messages('r2', 'foreign', [msg('f1', 1), msg('f2', 2)], now=T0)

    for scope in ('thread', 'resource'):
        with pytest.raises(InvalidInputError, match='Could not resolve cursor message: f1'):
            run(store, scope=scope, cursor='f1')
    with pytest.raises(InvalidInputError, match='Thread foreign was not found'):
        run(store, threadId='foreign')
    with pytest.raises(InvalidInputError, match='Thread foreign was not found'):
        run(store, threadId='foreign', cursor='f1')


# -- L62: paging ----------------------------------------------------------------------------------------------------
def test_forward_and_backward_pages_from_a_cursor(store: InMemoryStore) -> None:
    # m2 has five later messages (m3..m7) and two earlier ones (m0, m1)
    first = run(store, cursor='m2', page=1, limit=2)
    second = run(store, cursor='m2', page=2, limit=2)
    last = run(store, cursor='m2', page=3, limit=2)
    back = run(store, cursor='m2', page=-1, limit=2)
    back_one = run(store, cursor='m3', page=-1, limit=2)

    assert ids_in(first['messages']) == ['m3', 'm4'] and first['count'] == 2
    assert (first['hasNextPage'], first['hasPrevPage']) == (True, False)
    assert (first['cursor'], first['page'], first['limit'], first['detail']) == ('m2', 1, 2, 'low')
    assert ids_in(second['messages']) == ['m5', 'm6'] and (second['hasNextPage'], second['hasPrevPage']) == (True, True)
    assert ids_in(last['messages']) == ['m7'] and last['hasNextPage'] is False
    assert ids_in(back['messages']) == ['m0', 'm1'] and (back['hasNextPage'], back['hasPrevPage']) == (False, False)
    assert ids_in(back_one['messages']) == ['m1', 'm2'] and back_one['hasPrevPage'] is True
    assert run(store, cursor='m2', page=0, limit=2)['page'] == 1  # 0 is treated as 1


def test_rendering_shows_role_time_id_and_part_indices(store: InMemoryStore) -> None:
    result = run(store, cursor='m0', limit=2)

    assert result['messages'] == (
        '**assistant (2026-03-10 09:01:00Z)** [m1]:\n  [p0] message m1\n\n'
        '**user (2026-03-10 09:02:00Z)** [m2]:\n  [p0] message m2'
    )
    assert (result['truncated'], result['tokenOffset']) == (False, 0)


def test_thread_id_without_cursor_reads_from_the_start(store: InMemoryStore) -> None:
    store.append_messages(RES, OTHER, [msg(f'o{i}', 20 + i) for i in range(3)], now=T0)

    first = run(store, threadId=OTHER, limit=2)
    second = run(store, threadId=OTHER, limit=2, page=2)

    assert ids_in(first['messages']) == ['o0', 'o1'] and first['cursor'] == 'o0'
    assert (first['hasNextPage'], first['hasPrevPage']) == (True, False)
    assert ids_in(second['messages']) == ['o2'] and (second['hasNextPage'], second['hasPrevPage']) == (False, True)


def test_resource_scope_browses_another_thread_of_the_resource(store: InMemoryStore) -> None:
    store.append_messages(RES, OTHER, [msg(f'o{i}', 20 + i) for i in range(3)], now=T0)

    by_thread = run(store, threadId=OTHER, cursor='o0', limit=5)
    by_cursor_only = run(store, cursor='o0', limit=5)

    assert ids_in(by_thread['messages']) == ['o1', 'o2']
    assert ids_in(by_cursor_only['messages']) == ['o1', 'o2']
    with pytest.raises(InvalidInputError, match='does not belong to thread th2'):
        run(store, threadId=OTHER, cursor='m1')


def test_cursor_or_thread_is_required(store: InMemoryStore) -> None:
    with pytest.raises(InvalidInputError, match='Either cursor or threadId'):
        run(store)


# -- L63: detail levels and single parts ----------------------------------------------------------------------------
@pytest.fixture
def rich(store: InMemoryStore) -> InMemoryStore:
    long_text = ' '.join(f'word{i}' for i in range(60))
    store.append_messages(
        RES,
        THREAD,
        [
            msg(
                'rich',
                10,
                'assistant',
                parts=[
                    {'type': 'text', 'text': long_text},
                    {'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'weather', 'args': {'city': 'Lisbon'}},
                    {'type': 'image', 'url': 'https://example.com/a.png', 'filename': 'a.png'},
                ],
            ),
            msg(
                'result',
                11,
                'tool',
                parts=[
                    {'type': 'tool-result', 'toolCallId': 'c1', 'toolName': 'weather', 'result': {'temp': 21}},
                ],
            ),
        ],
        now=T0,
    )
    return store


def test_low_detail_truncates_text_and_names_tools(rich: InMemoryStore) -> None:
    long_text = ' '.join(f'word{i}' for i in range(60))

    result = run(rich, cursor='m7', limit=5)

    lines = result['messages'].splitlines()
    assert f'  [p0] {long_text[:120]}…' in '\n'.join(lines)
    assert long_text not in result['messages']
    assert 'call recall cursor="rich" partIndex=0 detail="high"' in result['messages']
    assert '  [p1] [Tool Call: weather]' in lines
    assert '  [p2] [Image: a.png]' in lines
    assert any(line.startswith('  [p0] [Tool Result: weather] {') for line in lines)
    assert result['count'] == 2


def test_high_detail_returns_one_part_with_continuation_hints(rich: InMemoryStore) -> None:
    long_text = ' '.join(f'word{i}' for i in range(60))

    first = run(rich, cursor='m7', detail='high')
    last = run(rich, cursor='rich', detail='high', limit=1)

    assert first['count'] == 1 and first['detail'] == 'high'
    assert long_text in first['messages']
    assert '[Tool Call' not in first['messages']
    assert 'next part: partIndex=1 on cursor="rich"' in first['messages']
    assert 'next message: partIndex=0 on cursor="result"' in first['messages']
    assert first['hasNextPage'] is True
    assert '[Tool Result: weather]\n{\n  "temp": 21\n}' in last['messages']
    assert last['hasNextPage'] is False and 'High detail returns 1 part' not in last['messages']


def test_part_index_returns_one_part_and_refuses_a_bad_index(rich: InMemoryStore) -> None:
    part = run(rich, cursor='rich', partIndex=1)

    assert part == {
        'text': '[Tool Call: weather]\n{\n  "city": "Lisbon"\n}',
        'messageId': 'rich',
        'partIndex': 1,
        'role': 'assistant',
        'type': 'tool-call',
        'truncated': False,
    }
    with pytest.raises(InvalidInputError, match=r'Part index 5 not found in message rich\. Available indices: 0, 1, 2'):
        run(rich, cursor='rich', partIndex=5)


# -- L64: the token budget ------------------------------------------------------------------------------------------
def test_output_over_the_budget_is_truncated_with_an_offset() -> None:
    store = InMemoryStore()
    big = [msg(f'b{i}', i, content=' '.join(['lorem'] * 1000)) for i in range(12)]
    store.append_messages(RES, THREAD, big, now=T0)

    result = run(store, cursor='b0', detail='high', partIndex=None)  # high: one part of 1000 words fits
    low = recall(
        store,
        COUNTER,
        resource_id=RES,
        current_thread_id=THREAD,
        request=RecallRequest(cursor='b0', detail='low'),
        max_tokens=50,
    )
    full = recall(
        store,
        COUNTER,
        resource_id=RES,
        current_thread_id=THREAD,
        request=RecallRequest(cursor='b0', part_index=0),
        max_tokens=100,
    )

    assert result['truncated'] is False
    assert low['truncated'] is True and low['tokenOffset'] > 0
    assert '... [truncated ~' in low['messages']
    assert COUNTER.count_string(low['messages'].rsplit('\n...', 1)[0]) <= 50
    assert full['truncated'] is True and COUNTER.count_string(full['text'].rsplit('\n...', 1)[0]) <= 100


def test_default_budget_is_8000_tokens() -> None:
    store = InMemoryStore()
    words = ' '.join(['lorem'] * 1000)
    store.append_messages(
        RES, THREAD, [msg('start', 0), *(msg(f'b{i}', i + 1, content=words) for i in range(12))], now=T0
    )

    # Low detail cuts each text to 120 characters, so the page is small; high detail in partIndex mode is not.
    page = run(store, cursor='start', limit=20)
    huge = run(store, threadId=THREAD, limit=20, detail='low')

    assert page['truncated'] is False and page['count'] == 12
    assert huge['truncated'] is False
    store.append_messages(RES, 'big', [msg('x', 0, content=' '.join(['lorem'] * 9000))], now=T0)
    part = run(store, thread='big', cursor='x', partIndex=0)
    assert part['truncated'] is True


# -- threads mode ---------------------------------------------------------------------------------------------------
def _threads_store() -> InMemoryStore:
    store = InMemoryStore()
    for n, day in enumerate((1, 5, 9)):
        when = datetime(2026, 3, day, 12, tzinfo=UTC)
        store.append_messages(RES, f't{n}', [msg(f't{n}-m', 0)], now=when)
    store.append_messages('r2', 'foreign', [msg('f', 0)], now=T0)
    titled = store.get_thread(RES, 't1')
    assert titled is not None
    store.update_thread(titled.model_copy(update={'title': 'Trip planning'}))
    return store


def test_threads_lists_the_resource_with_the_current_marker() -> None:
    store = _threads_store()

    result = run(store, thread='t1', mode='threads')

    assert result['count'] == 3 and result['page'] == 0 and result['hasMore'] is False
    text = result['threads']
    assert (
        '- **Trip planning** ← current\n  id: t1\n  updated: 2026-03-05 12:00:00Z | created: 2026-03-05 12:00:00Z'
        in text
    )
    assert text.index('id: t2') < text.index('id: t1') < text.index('id: t0')  # newest activity first
    assert '(untitled)' in text and 'foreign' not in text


def test_threads_pages_and_date_filters() -> None:
    store = _threads_store()

    first = run(store, thread='t1', mode='threads', limit=2)
    second = run(store, thread='t1', mode='threads', limit=2, page=1)
    after = run(store, thread='t1', mode='threads', after='2026-03-04')
    before = run(store, thread='t1', mode='threads', before='2026-03-05T12:00:00Z')
    none = run(store, thread='t1', mode='threads', after='2030-01-01')

    assert first['count'] == 2 and first['hasMore'] is True
    assert second['count'] == 1 and second['hasMore'] is False and second['page'] == 1
    assert after['count'] == 2 and 'id: t0' not in after['threads']
    assert before['count'] == 1 and 'id: t0' in before['threads']
    assert none == {'threads': 'No threads found matching the criteria.', 'count': 0, 'page': 0, 'hasMore': False}
    with pytest.raises(InvalidInputError, match='before must be an ISO 8601 date'):
        run(store, thread='t1', mode='threads', before='last tuesday')


def test_threads_in_thread_scope_show_only_the_current_thread() -> None:
    result = run(_threads_store(), scope='thread', thread='t1', mode='threads')

    assert result['count'] == 1 and 'id: t1' in result['threads'] and '← current' in result['threads']


# -- search and arguments -------------------------------------------------------------------------------------------
def test_search_needs_vectors(store: InMemoryStore) -> None:
    with pytest.raises(InvalidInputError, match=r'semantic search needs retrieval: \{vector: true\}'):
        run(store, mode='search', query='lisbon')


def test_arguments_from_the_model_are_checked() -> None:
    assert RecallRequest.from_args({'page': -1.0, 'partIndex': 2, 'threadId': 't'}) == RecallRequest(
        page=-1, part_index=2, thread_id='t'
    )
    for bad in ({'mode': 'everything'}, {'detail': 'medium'}, {'limit': 0}, {'page': 1.5}, {'cursor': 3}):
        with pytest.raises(InvalidInputError):
            RecallRequest.from_args(bad)


def test_declarations() -> None:
    assert RECALL_TOOL.name == 'recall'
    assert set(RECALL_TOOL.parameters['properties']) == {
        'mode',
        'query',
        'cursor',
        'threadId',
        'page',
        'limit',
        'detail',
        'partIndex',
        'before',
        'after',
    }
    assert 'threadId' not in recall_tool('thread').parameters['properties']


# -- the chat tool loop ---------------------------------------------------------------------------------------------
class AlwaysRecalls:
    """An Actor that keeps asking for recall (with some text), to exhaust the tool rounds."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse(
            text='Looking it up.',
            model=model_id,
            function_calls=(FunctionCall(name='recall', args={'cursor': 'm0', 'limit': 1}),),
        )


def test_chat_stops_recall_rounds_after_the_limit_and_leaves_no_open_call() -> None:

    clock = ManualClock(tick=timedelta(seconds=1))
    store = InMemoryStore()
    model = AlwaysRecalls()
    engine = MemoryEngine(
        OMConfig.model_validate(
            {'model': 'default', 'retrieval': True, 'observation': {'messageTokens': 10_000, 'bufferTokens': False}}
        ),
        store=store,
        router=ModelRouter({'google': model}, clock=clock, sleep=clock.advance),
        counter=COUNTER,
        clock=clock,
    )
    store.append_messages(RES, THREAD, [msg('m0', 0), msg('m1', 1)], now=T0)

    result = MemoryService(engine).chat(RES, THREAD, msg('u', 5, content='What did I say first?'))

    assert result.actor_calls == MAX_TOOL_ROUNDS + 1
    assert [t.name for t in model.requests[0].tools] == ['recall']
    assert result.reply is not None and result.reply.text() == 'Looking it up.'
    assert not any(isinstance(p, ToolCallPart) for p in result.reply.parts)
    stored = store.list_messages(RES, THREAD, limit=100).messages
    assert [m.role for m in stored] == ['user', 'user', 'user', *(['assistant', 'tool'] * MAX_TOOL_ROUNDS), 'assistant']
    tool_result = stored[4].parts[0]
    assert tool_result.type == 'tool-result' and '[m1]' in tool_result.result['messages']  # type: ignore[union-attr]


def test_obscured_thread_ids_are_shown_and_resolved_back():
    from om_lib.observation.resource_scope import shown_thread_id
    from tests.unit.test_engine import WordTokenizer

    store = InMemoryStore()
    now = datetime(2025, 3, 1, tzinfo=UTC)
    for tid in ('project-atlas', 'current'):
        store.append_messages(
            'r1',
            tid,
            [Message.model_validate({'id': f'{tid}-m', 'role': 'user', 'createdAt': now.isoformat(), 'content': tid})],
            now=now,
        )
    counter = TokenCounter(WordTokenizer())
    listed = recall(
        store, counter, resource_id='r1', current_thread_id='current',
        request=RecallRequest(mode='threads'), obscure_thread_ids=True,
    )  # fmt: skip
    shown = shown_thread_id('r1', 'project-atlas')
    assert f'id: {shown}' in listed['threads'] and 'project-atlas' not in listed['threads']
    # The model passes the shown id back: it reads the real thread
    page = recall(
        store, counter, resource_id='r1', current_thread_id='current',
        request=RecallRequest(mode='messages', thread_id=shown), obscure_thread_ids=True,
    )  # fmt: skip
    assert 'project-atlas' in page['messages']
    # Another resource's hash never resolves
    other = shown_thread_id('r2', 'project-atlas')
    with pytest.raises(InvalidInputError):
        recall(
            store, counter, resource_id='r1', current_thread_id='current',
            request=RecallRequest(mode='messages', thread_id=other), obscure_thread_ids=True,
        )  # fmt: skip

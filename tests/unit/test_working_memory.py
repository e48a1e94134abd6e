"""Working memory (om_lib/history/working_memory.py) and its tool in the chat service, over the in-memory store."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig, WorkingMemoryConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import ThreadNotFoundError
from om_lib.history.working_memory import (
    DEFAULT_TEMPLATE,
    MAX_WORKING_MEMORY_BYTES,
    TOOL_NAME,
    InvalidWorkingMemoryError,
    WorkingMemory,
    WorkingMemoryDisabledError,
    WorkingMemoryTooLargeError,
    deep_merge,
)
from om_lib.llm import FunctionCall, ModelRequest, ModelResponse
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.service import MemoryService

SCHEMA: dict[str, Any] = {
    'type': 'object',
    'properties': {
        'name': {'type': 'string'},
        'location': {'type': 'string'},
        'preferences': {
            'type': 'object',
            'properties': {'style': {'type': 'string'}, 'deadlines': {'type': 'array', 'items': {'type': 'string'}}},
        },
    },
    'additionalProperties': False,
}


class WordTokenizer:
    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


def working(store: InMemoryStore, **config: Any) -> WorkingMemory:
    return WorkingMemory(WorkingMemoryConfig.model_validate({'enabled': True, **config}), store, ManualClock())


def thread(store: InMemoryStore, resource: str, thread_id: str) -> None:
    store.create_thread(resource, thread_id, now=ManualClock().now())


# -- merge rules ----------------------------------------------------------------------------------------------------
def test_deep_merge_merges_objects_deletes_nulls_and_replaces_arrays() -> None:
    base = {'name': 'Sam', 'prefs': {'style': 'formal', 'deadlines': ['a', 'b']}, 'city': 'Berlin'}
    patch = {'prefs': {'deadlines': ['c'], 'goal': 'MVP'}, 'city': None, 'new': {'x': None, 'y': 1}}

    assert deep_merge(base, patch) == {
        'name': 'Sam',
        'prefs': {'style': 'formal', 'deadlines': ['c'], 'goal': 'MVP'},
        'new': {'y': 1},
    }
    assert base['prefs']['deadlines'] == ['a', 'b']  # the input is not changed


# -- Markdown: replace semantics ----------------------------------------------------------------------------------
def test_markdown_updates_replace_and_resource_scope_is_shared_by_threads() -> None:
    store = InMemoryStore()
    thread(store, 'r1', 't1')
    thread(store, 'r1', 't2')
    wm = working(store, template='# User\n- Name:\n- City:')

    assert wm.get('r1', 't1').to_json() == {'workingMemory': None, 'scope': 'resource', 'format': 'markdown'}
    wm.update('r1', 't1', '# User\n- Name: Sam\n- City:')
    view = wm.update('r1', 't2', '# User\n- Name: Sam\n- City: Berlin')

    assert view.value == '# User\n- Name: Sam\n- City: Berlin'
    assert wm.get('r1', 't1').value == view.value == wm.get('r1', None).value
    assert wm.get('r2', None).value is None  # resources are kept apart
    assert store.get_working_memory('r1', None).version == 2


def test_markdown_refuses_a_non_string_and_writes_nothing() -> None:
    store = InMemoryStore()
    wm = working(store)
    wm.update('r1', None, 'kept')

    with pytest.raises(InvalidWorkingMemoryError, match='Markdown text'):
        wm.update('r1', None, {'name': 'Sam'})
    assert wm.get('r1', None).value == 'kept'


def test_too_large_is_refused() -> None:
    wm = working(InMemoryStore())
    with pytest.raises(WorkingMemoryTooLargeError):
        wm.update('r1', None, 'x' * (MAX_WORKING_MEMORY_BYTES + 1))


# -- JSON: merge semantics ------------------------------------------------------------------------------------------
def test_json_updates_merge_and_are_validated_against_the_schema() -> None:
    store = InMemoryStore()
    wm = working(store, schema=SCHEMA)
    wm.update('r1', None, {'name': 'Sam', 'preferences': {'style': 'formal', 'deadlines': ['2025-07-01']}})
    wm.update('r1', None, {'location': 'Berlin', 'preferences': {'deadlines': ['2025-08-01']}})
    view = wm.update('r1', None, {'name': None})

    assert view.to_json() == {
        'workingMemory': {'location': 'Berlin', 'preferences': {'style': 'formal', 'deadlines': ['2025-08-01']}},
        'scope': 'resource',
        'format': 'json',
    }


@pytest.mark.parametrize(
    ('update', 'field'),
    [
        ({'name': 42}, 'name'),
        ({'colour': 'red'}, '(root)'),
        ({'preferences': {'deadlines': 'soon'}}, 'preferences/deadlines'),
    ],
)
def test_schema_violations_are_refused_with_details_and_change_nothing(update: dict, field: str) -> None:
    store = InMemoryStore()
    wm = working(store, schema=SCHEMA)
    wm.update('r1', None, {'name': 'Sam'})

    with pytest.raises(InvalidWorkingMemoryError) as caught:
        wm.update('r1', None, update)

    assert caught.value.details[0]['field'] == field and caught.value.details[0]['type'] == 'schema_violation'
    assert 'nothing was changed' in str(caught.value)
    assert wm.get('r1', None).value == {'name': 'Sam'}
    assert store.get_working_memory('r1', None).version == 1


def test_json_refuses_a_string() -> None:
    with pytest.raises(InvalidWorkingMemoryError, match='JSON object'):
        working(InMemoryStore(), schema=SCHEMA).update('r1', None, 'Sam')


# -- scopes ---------------------------------------------------------------------------------------------------------
def test_thread_scope_keeps_threads_apart_and_needs_an_owned_thread() -> None:
    store = InMemoryStore()
    thread(store, 'r1', 't1')
    thread(store, 'r1', 't2')
    wm = working(store, scope='thread')

    wm.update('r1', 't1', 'one')
    assert wm.get('r1', 't1').to_json() == {'workingMemory': 'one', 'scope': 'thread', 'format': 'markdown'}
    assert wm.get('r1', 't2').value is None
    with pytest.raises(ThreadNotFoundError):
        wm.update('r2', 't1', 'not yours')
    with pytest.raises(ThreadNotFoundError):
        wm.update('r1', 'missing', 'nope')
    with pytest.raises(WorkingMemoryDisabledError, match='thread-scoped'):
        wm.get('r1', None)
    # Erasing the thread erases its working memory.
    store.delete_thread('r1', 't1')
    thread(store, 'r1', 't1')
    assert wm.get('r1', 't1').value is None


def test_lost_race_is_retried_on_the_fresh_value() -> None:
    store = InMemoryStore()
    wm = working(store, schema=SCHEMA)
    wm.update('r1', None, {'name': 'Sam'})
    real_put = store.put_working_memory
    raced = []

    def racing_put(memory, *, expected_version):
        if not raced:
            raced.append(True)
            real_put(memory.model_copy(update={'content': {'name': 'Sam', 'location': 'Lisbon'}}), expected_version=1)
        return real_put(memory, expected_version=expected_version)

    store.put_working_memory = racing_put  # type: ignore[method-assign]
    view = wm.update('r1', None, {'preferences': {'style': 'casual'}})

    assert view.value == {'name': 'Sam', 'location': 'Lisbon', 'preferences': {'style': 'casual'}}


# -- what the Actor sees ----------------------------------------------------------------------------------------------
def test_system_text_and_tool_follow_format_and_read_only() -> None:
    store = InMemoryStore()
    thread(store, 'r1', 't1')
    markdown = working(store)
    text = markdown.system_text('r1', 't1', read_only=False)
    assert DEFAULT_TEMPLATE.strip() in text and '(empty: nothing stored yet)' in text and TOOL_NAME in text
    assert [t.name for t in markdown.tools(read_only=False)] == [TOOL_NAME]
    assert markdown.tool().parameters['properties']['memory']['type'] == 'string'
    assert markdown.tools(read_only=True) == []
    assert 'read-only' in markdown.system_text('r1', 't1', read_only=True)
    assert working(store, readOnly=True).tools(read_only=False) == []

    structured = working(store, schema=SCHEMA)
    structured.update('r1', None, {'name': 'Sam'})
    text = structured.system_text('r1', 't1', read_only=False)
    assert '"name": "Sam"' in text and '<working_memory_schema>' in text and 'null deletes' in text
    assert structured.tool().parameters['properties']['memory']['type'] == 'object'


def test_tool_runs_return_results_the_model_can_correct() -> None:
    store = InMemoryStore()
    wm = working(store, schema=SCHEMA)

    assert wm.run_tool({'memory': {'name': 'Sam'}}, 'r1', 't1') == ({'success': True}, False)
    assert wm.run_tool({'memory': '{"location": "Berlin"}'}, 'r1', 't1') == ({'success': True}, False)
    result, failed = wm.run_tool({'memory': {'name': 7}}, 'r1', 't1')
    assert failed and result['success'] is False and 'name' in result['error']
    assert wm.run_tool({}, 'r1', 't1')[1] is True
    assert wm.get('r1', None).value == {'name': 'Sam', 'location': 'Berlin'}


# -- configuration --------------------------------------------------------------------------------------------------
def test_config_refuses_template_and_schema_together_and_invalid_schemas() -> None:
    with pytest.raises(ValidationError, match='not both'):
        OMConfig.model_validate({'workingMemory': {'enabled': True, 'template': 'x', 'schema': SCHEMA}})
    with pytest.raises(ValidationError, match='not a valid JSON Schema'):
        OMConfig.model_validate({'workingMemory': {'enabled': True, 'schema': {'type': 'object', 'required': 'x'}}})
    with pytest.raises(ValidationError, match='JSON object'):
        OMConfig.model_validate({'workingMemory': {'enabled': True, 'schema': {'type': 'array'}}})


# -- the chat endpoint's tool loop ----------------------------------------------------------------------------------
class ToolModel:
    """Answers the Actor from a queue of functions of the request (text or function calls)."""

    def __init__(self, *answers: Callable[[ModelRequest], ModelResponse]) -> None:
        self.answers = list(answers)
        self.requests: list[ModelRequest] = []

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        self.requests.append(request)
        if request.purpose != 'actor':
            return ModelResponse(text='<observations>\n* 🟡 (09:00) x\n</observations>', model=model_id)
        return self.answers.pop(0)(request)


def call(args: dict[str, Any]) -> Callable[[ModelRequest], ModelResponse]:
    return lambda r: ModelResponse(text='', model='m', function_calls=(FunctionCall(TOOL_NAME, args, id='c1'),))


def reply(text: str) -> Callable[[ModelRequest], ModelResponse]:
    return lambda r: ModelResponse(text=text, model='m')


def chat_service(model: ToolModel, working_memory: dict[str, Any]) -> tuple[MemoryService, InMemoryStore, ManualClock]:
    clock = ManualClock(tick=timedelta(seconds=1))
    store = InMemoryStore()
    config = OMConfig.model_validate(
        {
            'model': 'default',
            'observation': {'messageTokens': 10_000, 'bufferTokens': False},
            'workingMemory': {'enabled': True, **working_memory},
        }
    )
    engine = MemoryEngine(
        config,
        store=store,
        router=ModelRouter({'google': model}, clock=clock, sleep=clock.advance),
        counter=TokenCounter(WordTokenizer()),
        clock=clock,
    )
    return MemoryService(engine), store, clock


def user(text: str, clock: ManualClock, mid: str = 'u1') -> Message:
    return Message.model_validate({'id': mid, 'role': 'user', 'createdAt': clock.now().isoformat(), 'content': text})


def test_chat_offers_the_tool_runs_it_and_saves_the_round() -> None:
    model = ToolModel(call({'memory': {'name': 'Sam', 'location': 'Berlin'}}), reply('Hi Sam!'))
    service, store, clock = chat_service(model, {'schema': SCHEMA})

    result = service.chat('r1', 't1', user('I am Sam from Berlin', clock))

    assert result.reply is not None and result.reply.text() == 'Hi Sam!'
    first = model.requests[0]
    assert [t.name for t in first.tools] == [TOOL_NAME] and '<working_memory>' in first.system
    assert store.get_working_memory('r1', None).content == {'name': 'Sam', 'location': 'Berlin'}
    roles = [m.role for m in store.list_messages('r1', 't1').messages]
    assert roles == ['user', 'assistant', 'tool', 'assistant']
    # The next turn's system message shows the stored working memory.
    model.answers.append(reply('You live in Berlin.'))
    service.chat('r1', 't1', user('Where do I live?', clock, 'u2'))
    assert '"location": "Berlin"' in model.requests[-1].system


def test_an_invalid_tool_update_changes_nothing_and_the_model_is_told() -> None:
    model = ToolModel(call({'memory': {'name': 5}}), reply('Sorry.'))
    service, store, clock = chat_service(model, {'schema': SCHEMA})

    service.chat('r1', 't1', user('I am Sam', clock))

    assert store.get_working_memory('r1', None) is None
    [tool_message] = [m for m in store.list_messages('r1', 't1').messages if m.role == 'tool']
    result = tool_message.parts[0]
    assert result.is_error and result.result['success'] is False and 'schema' in result.result['error']


def test_read_only_request_offers_no_tool() -> None:
    model = ToolModel(reply('Noted.'))
    service, store, clock = chat_service(model, {'template': '- Name:'})
    WorkingMemory(WorkingMemoryConfig(enabled=True, template='- Name:'), store, clock).update('r1', None, '- Name: Sam')

    service.chat('r1', 't1', user('hello', clock), read_only=True)

    [request] = model.requests
    assert request.tools == () and '- Name: Sam' in request.system and 'read-only' in request.system


def test_deeply_nested_updates_are_refused() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(2000):
        node['a'] = {}
        node = node['a']
    wm = working(InMemoryStore(), schema={'type': 'object'})
    with pytest.raises(InvalidWorkingMemoryError, match='nested'):
        wm.update('r1', None, deep)
    assert wm.update('r1', None, {'a': {'b': [[1, 2], {'c': None}]}}).value == {'a': {'b': [[1, 2], {'c': None}]}}


def test_config_refuses_remote_references_and_accepts_local_ones() -> None:
    with pytest.raises(ValidationError, match='only local references'):
        OMConfig.model_validate(
            {'workingMemory': {'enabled': True, 'schema': {'type': 'object', '$ref': 'https://example.com/s.json'}}}
        )
    local = {
        'type': 'object',
        '$defs': {'city': {'type': 'string'}},
        'properties': {'home': {'$ref': '#/$defs/city'}},
    }
    config = WorkingMemoryConfig.model_validate({'enabled': True, 'schema': local})
    wm = WorkingMemory(config, InMemoryStore(), ManualClock())
    assert wm.update('r1', None, {'home': 'Berlin'}).value == {'home': 'Berlin'}
    with pytest.raises(InvalidWorkingMemoryError):
        wm.update('r1', None, {'home': 3})

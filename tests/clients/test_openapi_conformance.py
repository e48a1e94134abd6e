"""The client against the served `GET /openapi.json`: every route it calls exists with that method, and every query
parameter and JSON body it sends is valid for that operation's documented schema."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from om_client import MemoryClient, Message
from om_client._calls import NOT_YET_SERVED_OK, ROUTES, UNSET, Call, Calls
from om_client.models import ImagePart, ToolCallPart, ToolResultPart

from om_cli.local_stack import LocalStack

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def every_call() -> list[Call[Any]]:
    """One call per client method, with every optional argument set (so every field the client can send is sent)."""
    calls = Calls('me')
    messages = [
        Message.user('hi', created_at=NOW),
        Message(role='user', parts=[ImagePart(url='s3://b/k', media_type='image/png', filename='a.png', size=3)]),
        Message(role='assistant', parts=[ToolCallPart(tool_call_id='c1', tool_name='f', args={'x': 1})]),
        Message(role='tool', parts=[ToolResultPart(tool_call_id='c1', tool_name='f', result={'y': 2}, is_error=True)]),
    ]
    return [
        calls.step('t1', messages, resource_id=None, step_number=2, read_only=True, actor_model='openai/gpt-5.5'),
        calls.turn('t1', messages, resource_id=None),
        calls.chat('t1', 'hello', resource_id=None, read_only=False),
        calls.chat_stream('t1', 'hello', resource_id=None, read_only=False),
        calls.memory('t1', resource_id=None),
        calls.memory_generations('t1', resource_id=None, limit=5),
        calls.observe('t1', [Message.user('from elsewhere', created_at=NOW)], resource_id=None),
        calls.reflect('t1', resource_id=None),
        calls.buffer('t1', resource_id=None),
        calls.messages('t1', resource_id=None, page=1, per_page=50, direction='DESC'),
        calls.query_messages(
            't1',
            resource_id=None,
            page=0,
            per_page=10,
            date_range=(NOW, NOW),
            include=['m1', {'id': 'm2', 'withPreviousMessages': 1, 'withNextMessages': 2}],
            vector_search_string='lisbon',
        ),
        calls.delete_messages('t1', ['m1', 'm2'], resource_id=None),
        calls.recall(
            't1',
            resource_id=None,
            mode='messages',
            query='q',
            cursor='m1',
            page=-1,
            limit=5,
            detail='high',
            part_index=0,
            before='2026-03-01',
            after='2026-01-01',
        ),
        calls.create_thread(resource_id=None, thread_id='t2', title='Trip', metadata={'topic': 'travel'}),
        calls.get_thread('t1', resource_id=None),
        calls.update_thread('t1', resource_id=None, title=None, metadata={'topic': 'x'}),
        calls.clone_thread(
            't1', resource_id=None, new_thread_id='t3', title='Copy', message_limit=10, date_range={'start': NOW}
        ),
        calls.delete_thread('t1', resource_id=None),
        calls.list_threads(
            resource_id=None, page=0, per_page=10, order_by='updatedAt', direction='ASC', metadata={'topic': 'x'}
        ),
        calls.delete_resource(None),
        calls.get_working_memory(resource_id=None, thread_id=None),
        calls.update_working_memory({'name': 'Ana'}, resource_id=None, thread_id=None),
        calls.get_working_memory(resource_id=None, thread_id='t1'),
        calls.update_working_memory('# Notes', resource_id=None, thread_id='t1'),
        calls.create_attachment('t1', resource_id=None, filename='a.png', media_type='image/png', size=3),
        calls.health(),
        calls.openapi(),
        calls.update_thread('t1', resource_id=None, title=UNSET, metadata=UNSET),
    ]


def _template(path: str) -> re.Pattern[str]:
    return re.compile('^' + re.sub(r'\{[^}]+\}', '[^/]+', path) + '$')


def _operation(document: dict[str, Any], method: str, path: str) -> tuple[str, dict[str, Any]] | None:
    for template, operations in document['paths'].items():
        if _template(template).match(path) and method.lower() in operations:
            return template, operations[method.lower()]
    return None


def _validate(document: dict[str, Any], schema: dict[str, Any], value: Any, where: str) -> None:
    root = {**schema, 'components': document.get('components', {})}
    errors = sorted(jsonschema.Draft202012Validator(root).iter_errors(value), key=lambda e: list(e.path))
    assert not errors, f'{where}: ' + '; '.join(f'{list(e.path)}: {e.message}' for e in errors)


@pytest.fixture(scope='module')
def served(stack: LocalStack) -> dict[str, Any]:
    with MemoryClient(stack.url) as om:
        return om.openapi()


def test_every_client_route_is_in_the_list_the_test_checks() -> None:
    built = {(c.method, re.sub(r'/(t1|me)(?=/|$)', '/{x}', c.path)) for c in every_call()}
    listed = {(m, re.sub(r'\{[^}]+\}', '{x}', p)) for m, p in ROUTES}

    assert built == listed


def test_every_route_the_client_calls_is_served(served: dict[str, Any]) -> None:
    missing = [
        (method, path)
        for method, path in ROUTES
        if _operation(served, method, path.replace('{threadId}', 't1').replace('{resourceId}', 'me')) is None
    ]

    # Routes of the contract the server does not serve yet may be missing; nothing else may.
    assert set(missing) <= NOT_YET_SERVED_OK, missing


TYPESCRIPT_SOURCES = Path(__file__).resolve().parents[2] / 'clients' / 'typescript' / 'src'
# A route the TypeScript client calls through openapi-fetch: `this.api.POST('/threads/{threadId}/steps', ...)`.
TYPESCRIPT_CALL = re.compile(r"this\.api\.(GET|POST|PUT|PATCH|DELETE)\('([^']+)'")
# The TypeScript client streams the chat through `POST …/chat` with `Accept: text/event-stream`, the route's other
# form, rather than the sibling route (both are served; docs/streaming.md).
TYPESCRIPT_STREAMS_THROUGH_CHAT = frozenset({('POST', '/threads/{threadId}/chat/stream')})


def test_every_served_route_has_a_method_in_both_clients(served: dict[str, Any]) -> None:
    methods = {'GET', 'POST', 'PUT', 'PATCH', 'DELETE'}
    routes = {
        (m.upper(), path) for path, operations in served['paths'].items() for m in operations if m.upper() in methods
    }
    typescript = {
        (method, path)
        for source in TYPESCRIPT_SOURCES.rglob('*.ts')
        if 'generated' not in source.parts
        for method, path in TYPESCRIPT_CALL.findall(source.read_text(encoding='utf-8'))
    }

    assert routes - set(ROUTES) == set(), 'served routes the Python client has no method for'
    assert routes - typescript - TYPESCRIPT_STREAMS_THROUGH_CHAT == set(), 'served routes the TypeScript client lacks'


@pytest.mark.parametrize('call', every_call(), ids=lambda c: f'{c.method} {c.path}')
def test_what_the_client_sends_matches_the_documented_operation(served: dict[str, Any], call: Call[Any]) -> None:
    found = _operation(served, call.method, call.path)
    if found is None:
        assert any(_template(p).match(call.path) for m, p in NOT_YET_SERVED_OK if m == call.method)
        pytest.skip(f'{call.method} {call.path} is in the contract but not served yet')
    template, operation = found

    parameters = {p['name']: p for p in operation.get('parameters', []) if p['in'] == 'query'}
    for name, value in (call.params or {}).items():
        if name.startswith('metadata.') and template == '/resources/{resourceId}/threads':
            continue  # `metadata.<key>=<value>` filters, documented in the operation's description
        assert name in parameters, f'{call.method} {template}: query parameter {name} is not documented'
        _validate(served, parameters[name]['schema'], value, f'{call.method} {template} ?{name}')
    required = {name for name, p in parameters.items() if p.get('required')}
    assert required <= set(call.params or {}), f'{call.method} {template}: missing {required - set(call.params or {})}'

    body_schema = operation.get('requestBody', {}).get('content', {}).get('application/json', {}).get('schema')
    if call.body is None:
        assert not operation.get('requestBody', {}).get('required'), f'{call.method} {template} needs a body'
        return
    assert body_schema is not None, f'{call.method} {template} takes no JSON body but the client sends one'
    _validate(served, body_schema, call.body, f'{call.method} {template} body')

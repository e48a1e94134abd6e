"""The chat route's streamed answer and idempotent requests, through the API Lambda's handler in-process under moto.

A caller that cannot stream (a buffered integration, `om invoke`) gets the whole UI message stream as the body; the
transports that stream (the Lambda streaming runtime, `om serve`) are tested in tests/e2e.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from functions.api import streaming
from tests.integration.test_api_handler import (
    RESOURCE,
    THREAD,
    Api,
    Context,
    api,
    assert_error,
    aws,
    aws_env,
    load_event,
)

__all__ = ['api', 'aws', 'aws_env']  # fixtures


def call(
    api: Api,
    body: Any,
    *,
    path: str = f'/threads/{THREAD}/chat/stream',
    headers: dict[str, str] | None = None,
    scenario: str = 'chat_stream',
) -> tuple[int, str, dict[str, str]]:
    event = copy.deepcopy(load_event(scenario))
    event['path'] = path
    event['body'] = json.dumps(body)
    for name, value in (headers or {}).items():
        event['headers'][name] = value
        event['multiValueHeaders'][name] = [value]
    result = api.handler.lambda_handler(event, Context())
    out = {k: ', '.join(v) for k, v in (result.get('multiValueHeaders') or {}).items()}
    out.update(result.get('headers') or {})
    return result['statusCode'], result.get('body') or '', {k.lower(): v for k, v in out.items()}


def chunks(body: str) -> list[Any]:
    """The SSE body's events, decoded (`[DONE]` as the string)."""
    events = [block for block in body.split('\n\n') if block]
    assert all(block.startswith('data: ') for block in events), events
    return [json.loads(b[6:]) if b != 'data: [DONE]' else '[DONE]' for b in events]


def test_a_caller_that_cannot_stream_gets_the_whole_ui_message_stream(api: Api) -> None:
    status, body, headers = call(api, {'resourceId': RESOURCE, 'content': 'Hello, I am Ana.'})
    assert status == 200
    assert headers['content-type'] == 'text/event-stream'
    assert headers['x-vercel-ai-ui-message-stream'] == 'v1'
    assert headers['cache-control'] == 'no-cache' and headers['x-accel-buffering'] == 'no'
    got = chunks(body)
    types = [c if isinstance(c, str) else c['type'] for c in got]
    assert types[0] == 'start' and types[-2:] == ['finish', '[DONE]']
    assert types.index('data-om-status') < types.index('start-step') < types.index('text-start')
    assert types.index('text-end') < types.index('finish-step') < types.index('finish')
    text = ''.join(c['delta'] for c in got if isinstance(c, dict) and c['type'] == 'text-delta')
    # The stored reply is what was streamed, under the id `start` announced
    status, page, _ = api.call('messages_get', path=f'/threads/{THREAD}/messages', query={'resourceId': RESOURCE})
    reply = page['messages'][-1]
    assert reply['id'] == got[0]['messageId'] and reply['parts'][0]['text'] == text and text


def test_accept_event_stream_on_chat_streams_and_json_stays_json(api: Api) -> None:
    status, body, headers = call(
        api,
        {'resourceId': RESOURCE, 'content': 'hi'},
        path=f'/threads/{THREAD}/chat',
        scenario='chat_basic',
        headers={'Accept': 'text/event-stream'},
    )
    assert status == 200 and headers['content-type'] == 'text/event-stream' and chunks(body)[-1] == '[DONE]'
    status, body, headers = call(
        api, {'resourceId': RESOURCE, 'content': 'hi again'}, path=f'/threads/{THREAD}/chat', scenario='chat_basic'
    )
    assert status == 200 and headers['content-type'] == 'application/json' and json.loads(body)['reply']


def test_the_ai_sdk_transport_body_is_accepted_and_only_the_newest_user_message_is_taken(api: Api) -> None:
    body = {
        'resourceId': RESOURCE,
        'id': 'chat-1',
        'trigger': 'submit-message',
        'messages': [
            {'id': 'u-old', 'role': 'user', 'parts': [{'type': 'text', 'text': 'an old message the client kept'}]},
            {
                'id': 'a-old',
                'role': 'assistant',
                'parts': [{'type': 'step-start'}, {'type': 'data-om-status', 'data': {}}],
            },
            {
                'id': 'u-new',
                'role': 'user',
                'parts': [{'type': 'text', 'text': 'I live in Porto.'}],
                'metadata': {'x': 1},
            },
        ],
    }
    status, text, _ = call(api, body)
    assert status == 200 and chunks(text)[-1] == '[DONE]'
    status, page, _ = api.call('messages_get', path=f'/threads/{THREAD}/messages', query={'resourceId': RESOURCE})
    assert [(m['id'], m['role']) for m in page['messages']][:1] == [('u-new', 'user')]
    assert len(page['messages']) == 2


def test_refusals_before_the_turn_began_keep_their_status(api: Api) -> None:
    # A message id stored with other content: 409, in the error shape, not a stream
    call(api, {'resourceId': RESOURCE, 'message': {'id': 'm1', 'role': 'user', 'content': 'first'}})
    status, body, headers = call(api, {'resourceId': RESOURCE, 'message': {'id': 'm1', 'role': 'user', 'content': 'x'}})
    assert status == 409 and headers['content-type'] == 'application/json'
    assert_error(json.loads(body), 'message_conflict')
    # A body of the AI SDK's shape with no user message: 422
    status, body, _ = call(api, {'resourceId': RESOURCE, 'messages': [{'id': 'a', 'role': 'assistant', 'parts': []}]})
    assert status == 422
    assert_error(
        json.loads(body), 'validation_error' if 'validation_error' in body else json.loads(body)['error']['code']
    )
    # Another caller's resource: 403 (IAM auth: the caller owns nothing here)
    assert streaming.take_pending() is None  # nothing was left behind for a transport


def test_a_retried_message_streams_its_stored_reply_again(api: Api) -> None:
    first = chunks(call(api, {'resourceId': RESOURCE, 'message': {'id': 'm7', 'role': 'user', 'content': 'Hi!'}})[1])
    again = chunks(call(api, {'resourceId': RESOURCE, 'message': {'id': 'm7', 'role': 'user', 'content': 'Hi!'}})[1])
    text = [
        ''.join(c['delta'] for c in got if isinstance(c, dict) and c['type'] == 'text-delta') for got in (first, again)
    ]
    assert first[0] == again[0] and text[0] == text[1]
    assert not [c for c in again if isinstance(c, dict) and c['type'].startswith('data-om-')]  # nothing ran
    status, page, _ = api.call('messages_get', path=f'/threads/{THREAD}/messages', query={'resourceId': RESOURCE})
    assert [m['role'] for m in page['messages']] == ['user', 'assistant']


def test_an_idempotency_key_makes_messages_without_ids_safe_to_retry(api: Api) -> None:
    turn = {'resourceId': RESOURCE, 'messages': [{'role': 'assistant', 'content': 'Saved once.'}]}
    key = {'Idempotency-Key': '6f1c2a9e-retry'}
    for _ in range(2):
        status, body, _ = call(api, turn, path=f'/threads/{THREAD}/turns', scenario='turns_basic', headers=key)
        assert status == 200
    saved_once = json.loads(body)['saved']
    status, body, _ = call(api, turn, path=f'/threads/{THREAD}/turns', scenario='turns_basic')
    status, page, _ = api.call('messages_get', path=f'/threads/{THREAD}/messages', query={'resourceId': RESOURCE})
    assert [m['id'] for m in page['messages']].count(saved_once[0]) == 1 and len(page['messages']) == 2
    status, body, _ = call(
        api, turn, path=f'/threads/{THREAD}/turns', scenario='turns_basic', headers={'Idempotency-Key': 'bad\x7fkey'}
    )
    assert status == 422

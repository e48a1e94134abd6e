"""Bedrock and OpenAI-compatible models end to end: the local stack over real HTTP, its functions calling the fake
Bedrock Runtime through the real boto3 client and the fake OpenAI server through the real openai client.

The stack starts all-Bedrock (Nova observing and reflecting, Claude as the Actor, Titan embeddings); the last tests
switch the Actor and the embeddings to OpenAI-compatible ones on the same stack.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from om_cli.local_stack import LocalStack
from tests.e2e.conftest import REFLECTION, Api, observer_block, running_stack
from tests.fakes.fake_bedrock import ConverseReply, ConverseRequest, FakeBedrock, fake_bedrock_env, keyword_embedding
from tests.fakes.fake_openai import ChatReply, ChatRequest, FakeOpenAI, fake_openai_env

pytestmark = pytest.mark.e2e

NOVA = 'us.amazon.nova-lite-v1:0'
CLAUDE = 'us.anthropic.claude-3-5-haiku-20241022-v1:0'
TITAN = 'amazon.titan-embed-text-v2:0'
BEDROCK_REPLY = 'Claude on Bedrock here; noted.'
OPENAI_REPLY = 'The OpenAI-compatible Actor here; noted.'
PNG = base64.b64decode(
    'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='
)
CONFIG: dict[str, Any] = {
    'model': f'bedrock/{NOVA}',
    'observation': {'messageTokens': 200, 'bufferTokens': False},
    'reflection': {'observationTokens': 300},
    'actorModel': f'bedrock/{CLAUDE}',
    'retrieval': {'vector': True},
    'semanticRecall': {'topK': 1, 'messageRange': 0},
}


class RoleAwareBedrock:
    """Answers Converse as the Observer, the Reflector or the Actor, told apart by the system prompt."""

    def __init__(self) -> None:
        self.observations = 0
        self._lock = threading.Lock()

    def __call__(self, request: ConverseRequest) -> ConverseReply:
        if 'observation reflector' in request.system_text:
            return ConverseReply.text(REFLECTION)
        if 'You are the memory of an AI assistant' in request.system_text:
            with self._lock:
                self.observations += 1
                return ConverseReply.text(observer_block(self.observations))
        return ConverseReply.text(BEDROCK_REPLY)


@pytest.fixture(scope='module')
def bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock(RoleAwareBedrock()) as server:
        yield server


@pytest.fixture(scope='module')
def openai_server() -> Iterator[FakeOpenAI]:
    # Keyword vectors, so a search finds what shares its words (the wire path is what is tested, not semantics)
    with FakeOpenAI(lambda _request: ChatReply.text(OPENAI_REPLY), embed_handler=keyword_embedding) as server:
        yield server


@pytest.fixture(scope='module')
def stack(gemini, bedrock, openai_server) -> Iterator[LocalStack]:
    server, _ = gemini
    env = {
        **fake_bedrock_env(bedrock),
        **fake_openai_env(openai_server),
        'OM_EMBEDDING_MODEL': f'bedrock/{TITAN}',
    }
    with running_stack(server, CONFIG, env) as running:
        yield running


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


@pytest.fixture(autouse=True)
def clean_scripts(bedrock: FakeBedrock, openai_server: FakeOpenAI) -> Iterator[None]:
    yield
    bedrock.reset()
    openai_server.reset()


def long_text(topic: str, words: int = 260) -> str:
    vocab = f'{topic} migration plan owner deadline budget rollout table queue region review'.split()
    return ' '.join(vocab[i % len(vocab)] for i in range(words))


def chat(api: Api, thread: str, text: str, resource: str = 'br') -> dict[str, Any]:
    status, body = api.post(f'/threads/{thread}/chat', {'resourceId': resource, 'content': text})
    assert status == 200, body
    return body


def reply_text(body: dict[str, Any]) -> str:
    return ''.join(p.get('text', '') for p in body['reply'].get('parts') or [])


def text_of(message: dict[str, Any]) -> str:
    return ''.join(p.get('text', '') for p in message.get('parts') or [])


def memory(api: Api, thread: str, resource: str = 'br') -> dict[str, Any]:
    status, body = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200, body
    return body


def converse_to(bedrock: FakeBedrock, model_id: str) -> list[ConverseRequest]:
    return [r for r in bedrock.converse_requests if r.model_id == model_id]


def test_a_conversation_is_observed_and_reflected_by_bedrock_with_a_bedrock_actor(
    api: Api, stack: LocalStack, bedrock: FakeBedrock
) -> None:
    # Given a conversation whose every message is past messageTokens
    for n in range(4):
        body = chat(api, 'conv', long_text(f'topic{n}'))
        # Then Claude on Bedrock answers each turn
        assert reply_text(body) == BEDROCK_REPLY
        stack.drain(timeout=60)

    # And Nova observed (in the request) and reflected (in the workflow), through the Converse API
    view = memory(api, 'conv')
    assert view['generationCount'] >= 1 and 'condensed' in view['observations']
    nova = converse_to(bedrock, NOVA)
    assert any('observation reflector' in r.system_text for r in nova)
    assert any('You are the memory of an AI assistant' in r.system_text for r in nova)
    assert all(r.signed for r in bedrock.converse_requests)
    # And the Actor's request carried the memory in its system prompt, cached, with the memory tool offered
    last_actor = converse_to(bedrock, CLAUDE)[-1]
    assert 'User stated fact' in last_actor.system_text or 'condensed' in last_actor.system_text
    assert last_actor.system_cache_points == 1
    assert 'recall' in last_actor.tool_names


def test_an_image_reaches_the_observer_as_bytes(api: Api, bedrock: FakeBedrock) -> None:
    message = {
        'role': 'user',
        'parts': [
            {'type': 'text', 'text': long_text('whiteboard')},
            {'type': 'image', 'mediaType': 'image/png', 'data': base64.b64encode(PNG).decode(), 'filename': 'b.png'},
        ],
    }
    status, body = api.post('/threads/img/steps', {'resourceId': 'br', 'messages': [message]})
    assert status == 200, body
    # A step observes what came before its own input: the next step observes the image
    status, body = api.post(
        '/threads/img/steps', {'resourceId': 'br', 'messages': [{'role': 'user', 'content': 'and?'}]}
    )
    assert status == 200, body
    assert 'data-om-observation-end' in [p['type'] for p in body['parts']]
    (observed,) = [r for r in converse_to(bedrock, NOVA) if r.images]
    assert observed.images == [('png', PNG)]


def test_throttling_is_retried_and_the_reply_arrives(api: Api, bedrock: FakeBedrock) -> None:
    bedrock.script(CLAUDE, ConverseReply.error('ThrottlingException', 'Too many requests, please wait'))

    body = chat(api, 'throttle', 'Hello again')

    assert reply_text(body) == BEDROCK_REPLY
    assert [c.status for c in bedrock.calls_for(CLAUDE)] == [429, 200]


def test_model_access_not_enabled_fails_at_once_naming_the_model(api: Api, bedrock: FakeBedrock) -> None:
    bedrock.script(NOVA, ConverseReply.error('AccessDeniedException', "You don't have access to the model"))
    said = {'resourceId': 'br', 'messages': [{'role': 'user', 'content': long_text('denied')}]}
    assert api.post('/threads/denied/steps', said)[0] == 200

    # The next step makes observation due (a step observes what came before its own input)
    status, body = api.post(
        '/threads/denied/steps', {'resourceId': 'br', 'messages': [{'role': 'user', 'content': 'and?'}]}
    )

    assert status == 200, body
    (failed,) = [p['data'] for p in body['parts'] if p['type'] == 'data-om-observation-failed']
    assert f'bedrock/{NOVA}' in failed['error'] and 'Model access' in failed['error']
    assert [c.status for c in bedrock.calls_for(NOVA)] == [403]  # never retried


def test_the_recall_tool_round_trips_through_converse_on_titan_vectors(
    api: Api, stack: LocalStack, bedrock: FakeBedrock
) -> None:
    # Given an earlier thread, embedded with Titan by the worker
    chat(api, 'pets', 'I adopted a small dog from the shelter last spring')
    stack.drain(timeout=60)
    titan = [r for r in bedrock.invoke_requests if r.model_id == TITAN]
    assert titan and all(r.body['dimensions'] == 256 and r.body['normalize'] is True for r in titan)

    # When the Actor asks the recall tool to search, then answers
    bedrock.script(CLAUDE, ConverseReply.tool_use(('recall', {'mode': 'search', 'query': 'dog shelter'})))
    body = chat(api, 'travel', 'Which dog from the shelter did I adopt?')

    # Then semantic recall had already put the earlier message in Claude's system prompt (Titan-embedded query)
    first = converse_to(bedrock, CLAUDE)[-2]
    assert '<semantic-recall>' in first.system_text and 'small dog from the shelter' in first.system_text

    # And the tool ran here and its result went back to Claude in a toolResult paired with the toolUse
    assert reply_text(body) == BEDROCK_REPLY
    second = converse_to(bedrock, CLAUDE)[-1]
    (use,) = second.blocks('toolUse')
    (result,) = second.tool_results
    assert use['toolUseId'] == result['toolUseId']
    # (the search ran on Titan vectors: the shared words find the dog in the other thread, as its best match there)
    lines = json.loads(result['content'][0]['text'])['results'].splitlines()
    pets = lines.index('threadId: pets')
    assert lines[pets + 1].endswith('I adopted a small dog from the shelter last spring')
    status, page = api.get('/threads/travel/messages?resourceId=br')
    assert status == 200
    assert [m['role'] for m in page['messages']] == ['user', 'assistant', 'tool', 'assistant']

    # And semantic search over HTTP finds the message through Titan vectors
    status, found = api.post(
        '/threads/pets/messages/query',
        {'resourceId': 'br', 'perPage': 0, 'vectorSearchString': 'small dog adopted last spring'},
    )
    assert status == 200, found
    assert 'I adopted a small dog from the shelter last spring' in [text_of(m) for m in found['messages']]


def test_an_openai_actor_and_openai_embeddings_on_the_same_memory(
    api: Api, stack: LocalStack, bedrock: FakeBedrock, openai_server: FakeOpenAI, settings_env
) -> None:
    # Given the Actor and the embeddings switched to an OpenAI-compatible endpoint (Nova still observes)
    settings_env(
        OM_CONFIG=json.dumps({**CONFIG, 'actorModel': 'openai/gpt-4o-mini'}),
        OM_EMBEDDING_MODEL='openai/text-embedding-3-small',
    )

    # When a conversation runs past messageTokens
    body = chat(api, 'oa', long_text('lisbon'), resource='oa')
    stack.drain(timeout=60)
    second = chat(api, 'oa', 'Where is the office moving?', resource='oa')

    # Then the OpenAI-compatible Actor answered with Nova's observations in its system message and the tools offered
    assert reply_text(body) == reply_text(second) == OPENAI_REPLY
    assert any('You are the memory of an AI assistant' in r.system_text for r in converse_to(bedrock, NOVA))
    last: ChatRequest = openai_server.chat_requests[-1]
    assert last.model == 'gpt-4o-mini' and 'User stated fact' in last.system_text
    assert 'recall' in last.tool_names
    # And the worker embedded the messages through the embeddings endpoint, at the configured size
    embedded = openai_server.embedding_requests
    assert embedded and all(r.body['dimensions'] == 256 for r in embedded)
    status, found = api.post(
        '/threads/oa/messages/query', {'resourceId': 'oa', 'perPage': 0, 'vectorSearchString': 'office moving'}
    )
    assert status == 200, found
    assert 'Where is the office moving?' in [text_of(m) for m in found['messages']]

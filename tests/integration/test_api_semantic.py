"""Semantic search through `lambda_handler` under moto, embeddings from the real google-genai client against the fake
Gemini server (`:batchEmbedContents`): indexing after turns, `/recall` search mode, `vectorSearchString`, recalled
context in chat, erase (table scans), the buffer worker's `embed` job and the DynamoDB vector index itself."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from functions import _wiring
from om_lib.adapters.aws.dynamodb.schema import create_table
from om_lib.adapters.aws.dynamodb.vectors import DynamoVectorIndex
from om_lib.models.embedders import HashingEmbedder
from om_lib.ports import VectorEntry
from tests.fakes.fake_gemini import FakeGemini, FakeReply
from tests.fakes.loopback import keyword_embedding  # keyword overlap: enough to check the plumbing
from tests.integration.test_api_handler import BUCKET, FLASH, TABLE, Api, Context, load_json_body
from tests.integration.test_workers import load_event

RES, OTHER = 'user-42', 'user-99'
EMBED_MODEL = 'gemini-embedding-001'
CONFIG = {
    'model': 'default',
    'retrieval': {'vector': True},
    'semanticRecall': {'topK': 2, 'messageRange': 1, 'scope': 'resource'},
}


@pytest.fixture
def gemini(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGemini]:
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_SESSION_TOKEN': 'testing',
        'AWS_DEFAULT_REGION': 'eu-west-1',
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
        'POWERTOOLS_TRACE_DISABLED': '1',
        'OM_TABLE_NAME': TABLE,
        'OM_BUCKET_NAME': BUCKET,
        'OM_AUTH_MODE': 'iam',
        'OM_CONFIG': json.dumps(CONFIG),
    }.items():
        monkeypatch.setenv(name, value)
    for name in (
        'AWS_ENDPOINT_URL',
        'AWS_ENDPOINT_URL_DYNAMODB',
        'AWS_ENDPOINT_URL_S3',
        'AWS_PROFILE',
        'AWS_LAMBDA_FUNCTION_NAME',
        'OM_CONFIG_FILE',
        'OM_WORK_QUEUE_URL',
        'OM_REFLECTION_STATE_MACHINE_ARN',
        'OM_GEMINI_SECRET_ARN',
        'OM_OFFLINE_FALLBACK',
        'OM_EMBEDDING_MODEL',
        'OM_EMBEDDING_DIMENSIONS',
        'GOOGLE_API_KEY',
    ):
        monkeypatch.delenv(name, raising=False)
    with FakeGemini(embed_handler=keyword_embedding) as server:
        monkeypatch.setenv('GOOGLE_GEMINI_BASE_URL', server.url)
        monkeypatch.setenv('GEMINI_API_KEY', 'test-key')
        yield server


@pytest.fixture
def api(gemini: FakeGemini) -> Iterator[Api]:
    from functions.api import handler

    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        create_table(boto3.client('dynamodb'), TABLE)
        boto3.client('s3').create_bucket(Bucket=BUCKET, CreateBucketConfiguration={'LocationConstraint': 'eu-west-1'})
        _wiring.reset()
        _wiring.upload_signer.cache_clear()
        yield Api(handler)
        _wiring.reset()
        _wiring.upload_signer.cache_clear()


def turn(api: Api, thread: str, user: str, reply: str, *, resource: str = RES, n: int = 0) -> None:
    status, _ = api.step(user, thread=thread, resource=resource, id=f'{thread}-u{n}')
    assert status == 200
    status, body, _ = api.call(
        'turns_basic',
        path=f'/threads/{thread}/turns',
        body={'resourceId': resource, 'messages': [{'id': f'{thread}-a{n}', 'role': 'assistant', 'content': reply}]},
    )
    assert status == 200, body


def seed(api: Api) -> None:
    turn(api, 'trip', 'I am planning a trip to Lisbon in May', 'Lisbon in May is lovely; book the tram tour early.')
    turn(api, 'garden', 'My tomato plants have yellow leaves', 'Yellow leaves on tomato plants mean overwatering.')
    turn(api, 'bank', 'my tomato plants bank pin is 1234', 'Noted.', resource=OTHER)


def vector_items() -> list[dict]:
    ddb = boto3.client('dynamodb')
    items: list[dict] = []
    kwargs: dict = {'TableName': TABLE}
    while True:
        page = ddb.scan(**kwargs)
        items += page['Items']
        if 'LastEvaluatedKey' not in page:
            return [i for i in items if i['PK']['S'].startswith('VEC#')]
        kwargs['ExclusiveStartKey'] = page['LastEvaluatedKey']


def search(api: Api, query: str, *, thread: str = 'trip', resource: str = RES) -> dict:
    body = {**load_json_body('recall_search'), 'resourceId': resource, 'threadId': thread, 'query': query}
    status, answer, _ = api.call('recall_search', body=body)
    assert status == 200, answer
    return answer


def test_turns_embed_messages_through_gemini_batch_embed(api: Api, gemini: FakeGemini) -> None:
    turn(api, 'trip', 'I am planning a trip to Lisbon in May', 'Book the tram tour early.')

    embeds = [c.request for c in gemini.calls if c.method == 'batchEmbedContents']
    # The step embedded its user message as a query (semantic recall in every step), the turn indexed both messages
    queries = [r for r in embeds if r.body['requests'][0]['taskType'] == 'RETRIEVAL_QUERY']
    assert len(queries) == 1 and queries[0].model == EMBED_MODEL
    embeds = [r for r in embeds if r not in queries]
    assert [r.model for r in embeds] == [EMBED_MODEL]
    [req] = embeds
    assert [item['taskType'] for item in req.body['requests']] == ['RETRIEVAL_DOCUMENT', 'RETRIEVAL_DOCUMENT']
    assert {item['outputDimensionality'] for item in req.body['requests']} == {256}
    [item] = vector_items()
    assert item['PK']['S'] == f'VEC#{RES}' and item['SK']['S'].startswith('T#trip#S')
    assert item['n']['N'] == '2' and item['through']['N'] == '2'
    # int8 vectors: 256 bytes plus a small header per message, not 256 floats.
    assert len(item['v']['B']) == 2 * 256 + 2 * 10 + len('trip-u0') + len('trip-a0')


def test_recall_search_mode_finds_messages_across_threads_but_never_another_resource(
    api: Api, gemini: FakeGemini
) -> None:
    seed(api)
    answer = search(api, 'tomato plants yellow leaves')
    assert set(answer) == {'results', 'count'} and answer['count'] >= 2
    assert 'threadId: garden' in answer['results'] and 'cursor="garden-u0"' in answer['results']
    assert 'bank' not in answer['results'] and '1234' not in answer['results']
    queries = [
        c.request for c in gemini.calls if c.method == 'batchEmbedContents' and 'RETRIEVAL_QUERY' in str(c.request.body)
    ]
    assert queries, 'the query is embedded as a query'


def test_recall_search_is_refused_without_vectors(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('OM_CONFIG', json.dumps({'model': 'default', 'retrieval': True}))
    _wiring.reset()
    turn(api, 'trip', 'Lisbon in May', 'Lovely.')
    body = {**load_json_body('recall_search'), 'resourceId': RES, 'threadId': 'trip'}
    status, answer, _ = api.call('recall_search', body=body)
    assert status == 422 and 'vector: true' in answer['error']['message']
    assert vector_items() == []  # nothing is embedded when vectors are off


def test_messages_query_with_vector_search_string(api: Api) -> None:
    seed(api)
    status, body, _ = api.call(
        'messages_query',
        path='/threads/trip/messages/query',
        body={'resourceId': RES, 'perPage': 1, 'vectorSearchString': 'yellow leaves on tomato plants'},
    )
    assert status == 200, body
    ids = [m['id'] for m in body['messages']]
    assert ids[-1] == 'trip-u0'  # the thread's own page last
    assert 'garden-u0' in ids and 'garden-a0' in ids  # matches (with messageRange) from the resource's other thread
    assert not any(i.startswith('bank') for i in ids)


def test_chat_merges_recalled_messages_into_the_actors_context(api: Api, gemini: FakeGemini) -> None:
    seed(api)
    gemini.script(FLASH, FakeReply.text('Water them less often.'))
    status, body, _ = api.call(
        'chat_basic',
        path='/threads/new-thread/chat',
        body={'resourceId': RES, 'content': 'What was wrong with my tomato plants yellow leaves?'},
    )
    assert status == 200, body
    [actor] = [c.request for c in gemini.calls if c.method == 'generateContent']
    assert '<semantic-recall>' in actor.system_text
    assert 'overwatering' in actor.system_text and 'From another conversation:' in actor.system_text
    assert '1234' not in actor.system_text
    # The chat's own messages are indexed after the turn.
    assert any(i['SK']['S'].startswith('T#new-thread#') for i in vector_items())


def test_chat_answers_when_the_embedding_model_fails(api: Api, gemini: FakeGemini) -> None:
    turn(api, 'trip', 'Lisbon in May', 'Lovely.')
    gemini.script(EMBED_MODEL, FakeReply.error(400), FakeReply.error(400), FakeReply.error(400))
    gemini.script(FLASH, FakeReply.text('Hello again.'))
    status, body, _ = api.call(
        'chat_basic', path='/threads/trip/chat', body={'resourceId': RES, 'content': 'where am I going?'}
    )
    assert status == 200, body
    assert body['reply']['parts'][0]['text'] == 'Hello again.'
    assert any(p['type'] == 'data-om-semantic-recall-failed' for p in body['parts'])


def test_erase_removes_vectors(api: Api) -> None:
    seed(api)
    before = vector_items()
    assert {i['PK']['S'] for i in before} == {f'VEC#{RES}', f'VEC#{OTHER}'}

    status, _, _ = api.call(
        'messages_delete', path='/threads/trip/messages', body={'resourceId': RES, 'messageIds': ['trip-u0']}
    )
    assert status == 204
    [trip] = [i for i in vector_items() if i['SK']['S'].startswith('T#trip#')]
    assert trip['n']['N'] == '1' and b'trip-u0' not in trip['v']['B'] and b'trip-a0' in trip['v']['B']

    status, _, _ = api.call('thread_delete', path='/threads/garden', query={'resourceId': RES})
    assert status == 204
    assert not any(i['SK']['S'].startswith('T#garden#') for i in vector_items())
    assert 'garden' not in search(api, 'tomato plants yellow leaves')['results']

    status, _, _ = api.call('resource_delete', path=f'/resources/{RES}')
    assert status == 204
    assert {i['PK']['S'] for i in vector_items()} == {f'VEC#{OTHER}'}


def test_buffer_worker_runs_embed_jobs(api: Api) -> None:
    from functions.buffer_worker import handler as worker

    api.step('a note about the Lisbon trip', thread='trip', id='trip-u0')  # a step alone does not embed
    assert vector_items() == []
    event = copy.deepcopy(load_event('buffer_worker', 'sqs_embed'))
    event['Records'][0]['body'] = json.dumps(
        {'kind': 'embed', 'resourceId': RES, 'threadId': 'trip', 'recordKey': f'vec:{RES}/trip', 'reason': 'turn'}
    )
    assert worker.lambda_handler(event, Context()) == {'batchItemFailures': []}
    [item] = vector_items()
    assert item['n']['N'] == '1'
    # A repeated job stores nothing twice.
    assert worker.lambda_handler(event, Context()) == {'batchItemFailures': []}
    assert len(vector_items()) == 1


def test_buffer_worker_embed_job_of_an_erased_thread_writes_nothing(api: Api) -> None:
    from functions.buffer_worker import handler as worker

    event = copy.deepcopy(load_event('buffer_worker', 'sqs_embed'))
    assert worker.lambda_handler(event, Context()) == {'batchItemFailures': []}
    assert vector_items() == []


def test_dynamo_vector_index_pages_large_resources_and_scopes_threads(api: Api) -> None:
    index = DynamoVectorIndex(TABLE)
    rng = random.Random(3)
    space = 'test@64'
    vectors = {f'm{i}': [rng.gauss(0, 1) for _ in range(64)] for i in range(3000)}
    entries = [VectorEntry(mid, i + 1, v) for i, (mid, v) in enumerate(vectors.items())]
    assert index.add(RES, 't1', entries[:2000], through_seq=2000, space=space)
    assert not index.add(RES, 't1', entries[:2000], through_seq=2000, space=space)  # same batch again: no-op
    assert index.add(RES, 't2', entries[2000:], through_seq=3000, space=space)
    assert index.indexed_through(RES, 't1', space=space) == 2000
    assert index.indexed_through(RES, 't1', space='other@64') == 0
    stats = index.stats(RES)
    assert stats['vectors'] == 3000 and stats['items'] >= 3  # split into items under 64 KB
    hit = index.search(RES, vectors['m2500'], space=space, top_k=3)[0]
    assert (hit.thread_id, hit.message_id, hit.seq) == ('t2', 'm2500', 2501) and hit.score > 0.99
    assert index.search(RES, vectors['m2500'], space=space, top_k=3, thread_id='t1')[0].message_id != 'm2500'
    assert index.search(OTHER, vectors['m2500'], space=space, top_k=3) == []
    assert index.search(RES, vectors['m2500'], space='other@64', top_k=3) == []


def test_dynamo_vector_index_deletes_by_seq_reading_only_the_batches_that_hold_them(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = DynamoVectorIndex(TABLE)
    rng = random.Random(5)
    vectors = {f'm{i}': [rng.gauss(0, 1) for _ in range(64)] for i in range(1000)}
    entries = [VectorEntry(mid, i + 1, v) for i, (mid, v) in enumerate(vectors.items())]
    for start in range(0, 1000, 100):  # ten indexing jobs: batch items of 100 messages, several per job
        index.add(RES, 't1', entries[start : start + 100], through_seq=start + 100, space='test@64')
    items = index.stats(RES)['items']
    read: list[str] = []
    real_get = index._get
    monkeypatch.setattr(index, '_get', lambda key: read.append(key['SK']['S']) or real_get(key))

    assert index.delete_messages(RES, 't1', ['m450', 'm451', 'm999'], seqs=[451, 452, 1000]) == 3

    assert len(read) == 2 < items  # the batch of m450/m451 and the one of m999, not every item of the thread
    assert index.stats(RES)['vectors'] == 997
    left = {h.message_id for h in index.search(RES, vectors['m451'], space='test@64', top_k=5)}
    assert 'm451' not in left and 'm450' not in left
    assert index.delete_messages(RES, 't1', None) == 997 and index.stats(RES)['items'] == 0


def test_the_embedder_follows_the_settings(gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> None:
    from om_lib.adapters.embedders.gemini import GeminiEmbedder
    from om_lib.adapters.embedders.local import LocalEmbedder, local_embedder_available

    _wiring.reset()
    assert isinstance(_wiring.embedder(), GeminiEmbedder) and _wiring.embedder().name == f'google/{EMBED_MODEL}@256'
    monkeypatch.setenv('OM_EMBEDDING_DIMENSIONS', '768')
    monkeypatch.setenv('OM_EMBEDDING_MODEL', 'hashing')
    _wiring.reset()
    assert _wiring.embedder().name == 'hashing@768'
    # No credentials (the local stack's offline fallback): the local model when installed, else hashing.
    monkeypatch.delenv('OM_EMBEDDING_MODEL')
    monkeypatch.delenv('GEMINI_API_KEY')
    monkeypatch.delenv('GOOGLE_GEMINI_BASE_URL')
    monkeypatch.setenv('OM_OFFLINE_FALLBACK', '1')
    _wiring.reset()
    expected = LocalEmbedder if local_embedder_available() else HashingEmbedder
    assert isinstance(_wiring.embedder(), expected)
    # Vectors off: no semantic memory at all.
    monkeypatch.setenv('OM_CONFIG', json.dumps({'model': 'default', 'retrieval': True}))
    _wiring.reset()
    assert _wiring.semantic() is None
    _wiring.reset()


def test_the_actor_searches_with_the_recall_tool_in_chat(api: Api, gemini: FakeGemini) -> None:
    seed(api)
    gemini.script(
        FLASH,
        FakeReply.function_calls(('recall', {'mode': 'search', 'query': 'yellow leaves on tomato plants'})),
        FakeReply.text('It was overwatering.'),
    )
    status, body, _ = api.call(
        'chat_basic', path='/threads/trip/chat', body={'resourceId': RES, 'content': 'what did we say about plants?'}
    )
    assert status == 200, body
    first, second = [c.request for c in gemini.calls if c.method == 'generateContent']
    [tool] = [t for t in first.tools if t['name'] == 'recall']
    assert 'mode "search"' in tool['description']
    responses = [
        part['functionResponse']['response']
        for content in second.body['contents']
        for part in content.get('parts') or []
        if 'functionResponse' in part
    ]
    assert responses and 'cursor="garden-' in responses[0]['results'] and '1234' not in responses[0]['results']
    assert body['reply']['parts'][0]['text'] == 'It was overwatering.'


def test_gemini_embedder_batches_and_normalises(gemini: FakeGemini) -> None:
    from om_lib.adapters.embedders.gemini import BATCH, GeminiEmbedder
    from om_lib.adapters.models.gemini import GeminiLanguageModel
    from om_lib.errors import ModelRequestError, ModelUnavailableError

    embedder = GeminiEmbedder(GeminiLanguageModel(api_key='k', base_url=gemini.url), dimensions=64)
    texts = [f'note {i}' for i in range(BATCH + 20)]
    vectors = embedder.embed(texts, kind='query', timeout_s=10)
    calls = [c.request for c in gemini.calls if c.method == 'batchEmbedContents']
    assert [len(c.body['requests']) for c in calls] == [BATCH, 20]
    assert {r['taskType'] for c in calls for r in c.body['requests']} == {'RETRIEVAL_QUERY'}
    assert len(vectors) == len(texts) and all(len(v) == 64 for v in vectors)
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0)
    gemini.script(EMBED_MODEL, FakeReply.error(503))
    with pytest.raises(ModelUnavailableError):
        embedder.embed(['x'], kind='document', timeout_s=10)
    gemini.script(EMBED_MODEL, FakeReply.error(400))
    with pytest.raises(ModelRequestError):
        embedder.embed(['x'], kind='document', timeout_s=10)

"""Erase means erased, over HTTP on the local stack: an upload URL issued before an erase leaves no file after it, and
deleting a message removes what was derived from it from every generation of memory and from the vector index.

Uploads: the bucket reports every new attachment object (S3 → EventBridge → the orphan-upload queue → its function,
as deployed); an object whose thread is gone, or was created again after the URL was issued, is deleted. Both orders
are tested: upload then erase (the erase deletes it), erase then upload (the event does).

Memory: the fake Observer writes down each sentence the user said and the fake Reflector keeps the first ones, so a
fact said first is in the first generation, in the reflection that followed it and in the vectors of its message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from om_cli.local_stack import LocalStack
from om_lib import vectors as vec
from tests.e2e.browser import SayingModels
from tests.e2e.conftest import Api, running_stack, wait_for
from tests.fakes.fake_gemini import FakeGemini

pytestmark = pytest.mark.e2e

CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 200, 'bufferTokens': False},
    'reflection': {'observationTokens': 200},
    'retrieval': {'vector': True},
}
SECRET = 'ZANZIBAR'
FACTS = [
    f'I keep my passport in the {SECRET} drawer. I live in Lisbon with Ana. We have two cats called Miso and Tofu.',
    'My sister Marta is getting married in Porto in September. I am her witness. I need a speech by August.',
    'I am vegetarian and allergic to peanuts. I cycle to work every day. Where can I buy a cargo bike?',
    'I am learning Japanese every morning. My teacher is called Kenji. I want to visit Kyoto next spring.',
    'I prefer short answers without bullet points. Please remind me about the passport renewal in June.',
    'My favourite band is Radiohead. I play the bass on Sundays. Our band rehearses near the river.',
    'I drink my coffee black. My office is on the fourth floor. The lift is often broken.',
]


@pytest.fixture(scope='module')
def models() -> Iterator[FakeGemini]:
    with FakeGemini(SayingModels()) as server:
        yield server


@pytest.fixture(scope='module')
def stack(models) -> Iterator[LocalStack]:
    with running_stack(models, CONFIG, {'OM_EMBEDDING_MODEL': 'hashing'}) as running:
        yield running


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


# ---------------------------------------------------------------------------------------------------------------------
# Uploads
# ---------------------------------------------------------------------------------------------------------------------
def objects(stack: LocalStack, prefix: str) -> list[str]:
    s3 = stack.client('s3')
    pages = s3.get_paginator('list_objects_v2').paginate(Bucket=stack.names.bucket, Prefix=prefix)
    return [o['Key'] for page in pages for o in page.get('Contents', [])]


def presign(api: Api, resource: str, thread: str, data: bytes = b'%PDF-1.4 hello') -> dict[str, Any]:
    status, body = api.post('/threads', {'resourceId': resource, 'id': thread})
    assert status in (201, 409), body
    status, upload = api.post(
        '/attachments',
        {'resourceId': resource, 'threadId': thread, 'filename': 'notes.pdf', 'mediaType': 'application/pdf',
         'size': len(data)},
    )  # fmt: skip
    assert status == 201, upload
    return upload


def put(upload: dict[str, Any], data: bytes = b'%PDF-1.4 hello') -> int:
    """PUT the bytes to the presigned URL with the headers it was signed with."""
    headers = {'Content-Type': 'application/pdf', 'x-amz-server-side-encryption': 'AES256'}
    request = urllib.request.Request(upload['uploadUrl'], data=data, method='PUT', headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def key_of(stack: LocalStack, upload: dict[str, Any]) -> str:
    return str(upload['url']).removeprefix(f's3://{stack.names.bucket}/')


@pytest.mark.parametrize('erase', ['resource', 'thread'])
def test_an_upload_url_used_after_the_erase_leaves_no_file(api, stack, erase):
    resource = f'up-late-{erase}'
    upload = presign(api, resource, 't1')
    path = f'/resources/{resource}' if erase == 'resource' else f'/threads/t1?resourceId={resource}'
    assert api.delete(path)[0] == 204
    # The URL still works (S3 checks only its signature) ...
    assert put(upload) == 200
    # ... but what it stored is deleted as soon as the bucket reports it
    wait_for(lambda: key_of(stack, upload) not in objects(stack, f'{resource}/'), timeout=30)
    stack.drain()
    assert objects(stack, f'{resource}/') == []


def test_an_upload_made_before_the_erase_goes_with_it(api, stack):
    upload = presign(api, 'up-early', 't1')
    assert put(upload) == 200
    stack.drain()
    assert key_of(stack, upload) in objects(stack, 'up-early/')  # a live thread's upload stays
    assert api.delete('/resources/up-early')[0] == 204
    assert objects(stack, 'up-early/') == []
    stack.drain()
    assert objects(stack, 'up-early/') == []


def test_an_old_upload_url_does_not_fill_a_new_thread_of_the_same_id(api, stack):
    old = presign(api, 'up-again', 't1')
    assert api.delete('/threads/t1?resourceId=up-again')[0] == 204
    new = presign(api, 'up-again', 't1')  # the same id, a new thread
    assert put(new) == 200 and put(old) == 200
    wait_for(lambda: key_of(stack, old) not in objects(stack, 'up-again/'), timeout=30)
    stack.drain()
    assert objects(stack, 'up-again/') == [key_of(stack, new)]


# ---------------------------------------------------------------------------------------------------------------------
# Deleting messages
# ---------------------------------------------------------------------------------------------------------------------
def chat(api: Api, thread: str, text: str) -> None:
    status, body = api.post(f'/threads/{thread}/chat', {'resourceId': 'eraser', 'content': text})
    assert status == 200, body


def generations(api: Api, thread: str) -> list[dict[str, Any]]:
    status, body = api.get(f'/threads/{thread}/memory/generations?resourceId=eraser&limit=100')
    assert status == 200, body
    return list(body['generations'])


def vector_ids(stack: LocalStack, thread: str) -> set[str]:
    ddb = stack.client('dynamodb')
    items = [i for page in ddb.get_paginator('scan').paginate(TableName=stack.names.table) for i in page['Items']]
    prefix = f'T#{quote(thread, safe="")}#'
    return {
        entry.message_id
        for item in items
        if item['PK']['S'] == 'VEC#eraser' and item['SK']['S'].startswith(prefix) and 'v' in item
        for entry in vec.unpack(item['v']['B'], int(item['dims']['N']))
    }


def test_deleting_a_message_removes_it_from_every_generation_and_the_vectors(api, stack):
    # Given a conversation observed, reflected (the fact said first survives the reflection) and embedded
    for fact in FACTS:
        chat(api, 'life', fact)
    stack.drain()
    wait_for(lambda: len(generations(api, 'life')) >= 2, timeout=30)
    stack.drain()
    before = generations(api, 'life')
    assert sum(SECRET in g['observations'] for g in before) >= 2, before
    status, page = api.get('/threads/life/messages?resourceId=eraser')
    (said,) = [m['id'] for m in page['messages'] if SECRET in json.dumps(m)]
    assert said in vector_ids(stack, 'life')
    # and a clone made before the delete
    status, body = api.post('/threads/life/clone', {'resourceId': 'eraser', 'newThreadId': 'life-copy'})
    assert status == 201, body

    # When the message is deleted
    status, _ = api.request('DELETE', '/threads/life/messages', {'resourceId': 'eraser', 'messageIds': [said]})
    assert status == 204

    # Then no generation, staged or active, holds what was derived from it, now or after the rest is observed again
    for _ in range(2):
        after = generations(api, 'life')
        assert after and not [g['generation'] for g in after if SECRET in g['observations']], after
        status, memory = api.get('/threads/life/memory?resourceId=eraser')
        assert SECRET not in json.dumps(memory), memory
        stack.drain()
    assert said not in vector_ids(stack, 'life') and vector_ids(stack, 'life')
    status, found = api.post(
        '/threads/life/messages/query', {'resourceId': 'eraser', 'vectorSearchString': f'{SECRET} drawer passport'}
    )
    assert status == 200 and SECRET not in json.dumps(found), found
    # The clone keeps its own copy: its messages and the memory it started with
    assert any(SECRET in g['observations'] for g in generations(api, 'life-copy'))

"""Resource scope over HTTP on the local stack: one memory across a user's threads, through the real google-genai
client and a fake Gemini that answers as a multi-thread Observer."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import pytest

from om_cli.local_stack import LocalStack
from om_lib.work import Job
from tests.e2e.conftest import Api, running_stack, wait_for
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest

THREAD_INPUT = re.compile(r'<thread id="([^"]+)">\n(.*?)\n</thread>', re.DOTALL)
CONFIG = {
    'model': 'default',
    'scope': 'resource',
    'observation': {'messageTokens': 400},
    'reflection': {'observationTokens': 30_000},
}


def multi_thread_observer(request: FakeRequest) -> FakeReply:
    """Observes each `<thread id>` section of the prompt: records the first thing the user said there."""
    if 'MULTI-THREAD' not in request.system_text and 'separate conversation threads' not in ''.join(request.user_texts):
        return FakeReply.text('Noted.')  # the Actor
    sections = []
    for shown, transcript in THREAD_INPUT.findall(''.join(request.user_texts)):
        said = next((line.split(': ', 1)[1] for line in transcript.splitlines() if line.startswith('User')), '?')
        sections.append(f'<thread id="{shown}">\nDate: Mar 3, 2025\n* 🔴 (09:00) User said: {said[:120]}\n</thread>')
    return FakeReply.text('<observations>\n' + '\n'.join(sections) + '\n</observations>')


@pytest.fixture(scope='module')
def gemini() -> Iterator[tuple[FakeGemini, object]]:
    with FakeGemini(multi_thread_observer) as server:
        yield server, multi_thread_observer


@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    with running_stack(gemini[0], CONFIG) as running:
        yield running


def step(api: Api, resource: str, thread: str, text: str) -> dict:
    message = {'role': 'user', 'parts': [{'type': 'text', 'text': text}]}
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [message]})
    assert status == 200, body
    return body


def filler(topic: str, words: int = 220) -> str:
    return ' '.join(f'{topic}{i}' for i in range(words))


def memory(api: Api, resource: str, thread: str) -> dict:
    status, body = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200, body
    return body


def test_a_fact_said_in_one_thread_reaches_another_before_and_after_observation(api, gemini):
    server, _ = gemini
    # Given Alice says where she lives in one conversation
    step(api, 'alice', 'alice-home', 'I live in Porto with two cats ' + filler('home', 100))
    # Then a new conversation of hers sees it at once, as another conversation (nothing observed yet)
    body = step(api, 'alice', 'alice-travel', 'Plan a weekend trip for me')
    assert 'I live in Porto with two cats' in body['system'] and '<other-conversation' in body['system']
    assert [c for c in server.calls if 'MULTI-THREAD' in c.request.system_text] == []
    # When what her conversations said before a step passes the threshold, both threads are observed in one
    # multi-thread call (a step's new input is the message the Actor answers: it neither counts nor is observed
    # there; the turn that answers it observes it, so it never shows twice)
    step(api, 'alice', 'alice-travel', filler('itinerary', 150))
    assert memory(api, 'alice', 'alice-travel')['observationTokens'] == 0
    body = step(api, 'alice', 'alice-travel', 'Which of these fits a weekend best?')
    assert memory(api, 'alice', 'alice-travel')['observationTokens'] > 0
    assert 'I live in Porto with two cats' in memory(api, 'alice', 'alice-home')['observations']
    reply = {'role': 'assistant', 'content': 'Here is a plan. ' + filler('plan', 250)}
    status, _ = api.post('/threads/alice-travel/turns', {'resourceId': 'alice', 'messages': [reply]})
    assert status == 200
    wait_for(lambda: memory(api, 'alice', 'alice-travel')['pendingMessageTokens'] == 0, timeout=30, interval=0.3)
    # And a third thread sees the fact in the shared observations, not as raw messages
    body = step(api, 'alice', 'alice-new', 'What do you know about me?')
    assert 'I live in Porto' in body['system'] and '<other-conversation' not in body['system']
    # Thread ids are obscured for the models by default
    observer_prompts = [c for c in server.calls if 'MULTI-THREAD' in c.request.system_text]
    assert observer_prompts and 'alice-home' not in ''.join(observer_prompts[0].request.user_texts)


def test_two_resources_never_see_each_others_memory(api):
    step(api, 'bob', 'bob-1', 'My locker code is 4242 ' + filler('bob'))
    reply = {'role': 'assistant', 'content': 'Noted.'}
    assert api.post('/threads/bob-1/turns', {'resourceId': 'bob', 'messages': [reply]})[0] == 200
    wait_for(lambda: memory(api, 'bob', 'bob-1')['observationTokens'] > 0, timeout=30)
    body = step(api, 'carol', 'carol-1', 'What is the locker code?')
    assert '4242' not in body['system']
    assert '4242' not in memory(api, 'carol', 'carol-1')['observations']
    assert api.get('/threads/bob-1/memory?resourceId=carol')[0] == 404


def test_a_quiet_thread_below_the_threshold_is_observed_by_the_worker(api, stack):
    step(api, 'dave', 'dave-quiet', 'I am allergic to peanuts')
    assert memory(api, 'dave', 'dave-quiet')['observationTokens'] == 0
    # The sweeper's job for a quiet thread (sent to the real queue; the worker runs it) observes it below the threshold
    job = Job('observe', 'dave', 'dave-quiet', 'resource:dave', 'stale')
    stack.client('sqs').send_message(
        QueueUrl=stack.queue_url,
        MessageBody=json.dumps(job.to_json()),
        MessageGroupId=job.record_key,
        MessageDeduplicationId=uuid.uuid4().hex,
    )
    wait_for(lambda: 'peanuts' in memory(api, 'dave', 'dave-quiet')['observations'], timeout=30, interval=0.5)


def test_imported_history_is_shown_under_its_real_thread_id_like_observed_messages(api):
    # Given Erin's memory holds a thread she talked in and a thread that only has history imported from elsewhere
    step(api, 'erin', 'erin-talk', 'I keep bees on my roof ' + filler('hive', 10))
    assert api.post('/threads/erin-talk/memory/observe', {'resourceId': 'erin'})[1]['status'] == 'done'
    assert api.post('/threads', {'resourceId': 'erin', 'id': 'erin-imported'})[0] == 201
    history = [
        {'role': 'user', 'content': 'I play the cello in a quartet.', 'createdAt': '2025-03-03T09:00:00Z'},
        {'role': 'assistant', 'content': 'Lovely.', 'createdAt': '2025-03-03T09:01:00Z'},
    ]
    status, done = api.post('/threads/erin-imported/memory/observe', {'resourceId': 'erin', 'messages': history})
    assert status == 200 and done['status'] == 'done', done
    # Then the log names both threads by their real ids, as docs/api.md says
    observations = memory(api, 'erin', 'erin-imported')['observations']
    assert re.findall(r'<thread id="([^"]+)">', observations) == ['erin-talk', 'erin-imported'], observations
    assert 'User said: I play the cello' in observations
    status, generations = api.get('/threads/erin-talk/memory/generations?resourceId=erin')
    assert status == 200 and '<thread id="erin-imported">' in generations['generations'][0]['observations']

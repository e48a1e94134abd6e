"""The worker handlers invoked in-process with the sample events (events/<function>/*.json) under moto.

The model is the built-in offline model (no credentials + OM_OFFLINE_FALLBACK=1): deterministic and local. Single
threaded on purpose: moto is not atomic under threads (aws-notes §1.4).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions import _wiring
from om_cli.local_stack import LocalLambdaContext
from om_lib.adapters.aws.dynamodb.schema import create_table
from om_lib.messages import Message

ROOT = Path(__file__).resolve().parents[2]
TABLE, BUCKET, QUEUE = 'om-memory', 'om-memory-blobs', 'om-work.fifo'
RESOURCE, THREAD = 'user-123', 'thread-abc'
RECORD_KEY = f'thread:{RESOURCE}/{THREAD}'
# Small thresholds: a handful of messages are due for observation, a few observations for reflection.
CONFIG = {
    'model': 'default',
    'observation': {'messageTokens': 120, 'bufferTokens': False},
    'reflection': {'observationTokens': 150},
}


def load_event(function: str, scenario: str) -> dict[str, Any]:
    return json.loads((ROOT / 'events' / function / f'{scenario}.json').read_text())


def invoke(function: str, event: dict[str, Any]) -> Any:
    from om_cli.local_stack import handler_for

    return handler_for(function)(event, LocalLambdaContext(function))


@pytest.fixture
def aws(monkeypatch):
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_SESSION_TOKEN': 'testing',
        'AWS_DEFAULT_REGION': 'us-east-1',
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
        'POWERTOOLS_TRACE_DISABLED': '1',
        'POWERTOOLS_METRICS_DISABLED': 'true',
        'OM_TABLE_NAME': TABLE,
        'OM_BUCKET_NAME': BUCKET,
        'OM_AUTH_MODE': 'none',
        'OM_OFFLINE_FALLBACK': '1',
        'OM_CONFIG': json.dumps(CONFIG),
    }.items():
        monkeypatch.setenv(name, value)
    for name in (
        'AWS_ENDPOINT_URL',
        'AWS_PROFILE',
        'OM_CONFIG_FILE',
        'OM_REFLECTION_STATE_MACHINE_ARN',
        'GEMINI_API_KEY',
        'GOOGLE_API_KEY',
        'GOOGLE_GEMINI_BASE_URL',
    ):
        monkeypatch.delenv(name, raising=False)
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        create_table(boto3.client('dynamodb'), TABLE)
        boto3.client('s3').create_bucket(Bucket=BUCKET)
        sqs = boto3.client('sqs')
        url = sqs.create_queue(QueueName=QUEUE, Attributes={'FifoQueue': 'true'})['QueueUrl']
        monkeypatch.setenv('OM_WORK_QUEUE_URL', url)
        _wiring.reset()
        yield sqs, url
        _wiring.reset()


def _say(step: int, text: str, role: str = 'user') -> Message:
    at = datetime(2025, 3, 3, 9, step, tzinfo=UTC).isoformat()
    return Message.model_validate({'id': f'{role[0]}{step}', 'role': role, 'createdAt': at, 'content': text})


def _conversation(turns: int, *, ago: timedelta = timedelta(0)) -> None:
    """Save turns straight into the store (no observation): the backlog a worker job is for."""
    engine = _wiring.engine()
    now = engine.clock.now() - ago
    for step in range(turns):
        engine.store.append_messages(
            RESOURCE,
            THREAD,
            [
                engine.counter.with_token_counts(
                    _say(step, f'Note {step}: my sister Maya moves to Lisbon on May {step + 1} with her cat Olive.')
                ),
                engine.counter.with_token_counts(
                    _say(step, f'Got it, Maya moves to Lisbon on May {step + 1}; Olive goes too.', 'assistant')
                ),
            ],
            now=now,
        )


def _sqs_event(*bodies: str) -> dict[str, Any]:
    sample = load_event('buffer_worker', 'sqs_batch')['Records'][0]
    records = []
    for i, body in enumerate(bodies):
        record = copy.deepcopy(sample)
        record['messageId'] = f'msg-{i}'
        record['body'] = body
        # Different groups: one malformed record must not hold back the others (skip_group_on_error).
        record['attributes']['MessageGroupId'] = f'group-{i}'
        records.append(record)
    return {'Records': records}


def _observe_body() -> str:
    body = json.loads(load_event('buffer_worker', 'sqs_batch')['Records'][0]['body'])
    assert body['recordKey'] == RECORD_KEY
    return json.dumps(body)


# ---------------------------------------------------------------------------------------------------------------------
# buffer worker
# ---------------------------------------------------------------------------------------------------------------------
def test_buffer_worker_sample_event_for_a_missing_thread_succeeds(aws):
    # Given the sample event, whose thread does not exist (erased before the job ran)
    # When the worker runs it / Then it succeeds with nothing to do: redelivering it could never help
    assert invoke('buffer_worker', load_event('buffer_worker', 'sqs_batch')) == {'batchItemFailures': []}


def test_buffer_worker_partial_failure_reports_only_the_malformed_record(aws):
    # Given a batch with a good job, a body that is not JSON and a JSON body that is not a job
    _conversation(4)
    event = _sqs_event(_observe_body(), 'not json', json.dumps({'kind': 'dance'}))
    # When the worker runs it
    result = invoke('buffer_worker', event)
    # Then exactly the malformed records fail (they are redelivered, then moved to the DLQ); the good one observed
    assert result == {'batchItemFailures': [{'itemIdentifier': 'msg-1'}, {'itemIdentifier': 'msg-2'}]}
    record = _wiring.store().get_record(RECORD_KEY)
    assert record is not None and record.observation_tokens > 0


def test_buffer_worker_job_delivered_twice_observes_once(aws):
    # Given a backlog over the threshold and its observe job
    _conversation(4)
    event = _sqs_event(_observe_body())
    # When SQS delivers the same job twice
    assert invoke('buffer_worker', event) == {'batchItemFailures': []}
    first = _wiring.store().get_record(RECORD_KEY)
    assert invoke('buffer_worker', event) == {'batchItemFailures': []}
    second = _wiring.store().get_record(RECORD_KEY)
    # Then the second delivery found nothing unobserved and wrote nothing
    assert first is not None and first.observation_tokens > 0
    assert second is not None and second.version == first.version
    assert second.active_observations == first.active_observations


def test_buffer_worker_failing_model_fails_the_record_for_redelivery(aws, monkeypatch):
    # Given a backlog and a model that is down
    from om_lib.errors import ModelUnavailableError
    from om_lib.models.offline_model import OfflineLanguageModel

    _conversation(4)

    def down(self, model_id, request, *, timeout_s):  # noqa: ANN001, ANN202
        raise ModelUnavailableError('503 from the model', status_code=503)

    monkeypatch.setattr(OfflineLanguageModel, 'generate', down)
    # When the worker runs the job / Then the record fails, so SQS redelivers it after the visibility timeout
    assert invoke('buffer_worker', _sqs_event(_observe_body())) == {'batchItemFailures': [{'itemIdentifier': 'msg-0'}]}
    record = _wiring.store().get_record(RECORD_KEY)
    assert record is None or record.observation_tokens == 0


def test_a_job_that_met_a_model_outage_comes_back_later_each_time(aws, monkeypatch):
    # Given a backlog, its job on the (moto) queue, and a model that is down
    from om_lib.adapters.aws.work import RETRY_BASE_S, retry_delay_s
    from om_lib.errors import ModelUnavailableError
    from om_lib.models.offline_model import OfflineLanguageModel

    sqs, url = aws
    _conversation(4)
    sqs.send_message(QueueUrl=url, MessageBody=_observe_body(), MessageGroupId='g', MessageDeduplicationId='d1')
    # (received with no visibility timeout of its own: only the worker's backoff can hide it afterwards)
    received = sqs.receive_message(QueueUrl=url, AttributeNames=['All'], VisibilityTimeout=0)['Messages'][0]

    def down(self, model_id, request, *, timeout_s):  # noqa: ANN001, ANN202
        raise ModelUnavailableError('503 from the model', status_code=503)

    monkeypatch.setattr(OfflineLanguageModel, 'generate', down)
    event = _sqs_event(received['Body'])
    event['Records'][0]['receiptHandle'] = received['ReceiptHandle']
    event['Records'][0]['attributes']['ApproximateReceiveCount'] = '1'
    # When the worker fails the job
    assert invoke('buffer_worker', event) == {'batchItemFailures': [{'itemIdentifier': 'msg-0'}]}
    # Then the message stays invisible for the backoff (not just the queue's own timeout): nothing to receive now
    assert sqs.receive_message(QueueUrl=url).get('Messages', []) == []
    # And each receive waits longer (30 s doubling to 15 min, jittered within the top half)
    assert RETRY_BASE_S // 2 <= retry_delay_s(1) <= RETRY_BASE_S
    assert 240 <= retry_delay_s(5) <= 480 and 450 <= retry_delay_s(12) <= 900


# ---------------------------------------------------------------------------------------------------------------------
# reflection workflow tasks
# ---------------------------------------------------------------------------------------------------------------------
def _reflection_event(task: str, owner: str) -> dict[str, Any]:
    event = load_event('reflection', task)
    event['owner'] = owner
    assert event['job']['recordKey'] == RECORD_KEY
    return event


def _grow_observations_past_the_reflection_threshold() -> None:
    # Saved as turns and observed by the worker: a step would reflect at the threshold itself (sync mode).
    engine = _wiring.engine()
    for step in range(12):
        engine.complete_turn(
            RESOURCE,
            THREAD,
            [_say(step, f'Fact {step}: the blue folder {step} holds invoice {1000 + step} for client Ortega {step}.')],
        )
        engine.observe_now(RESOURCE, THREAD, reflect=False)
        record = engine.store.get_record(RECORD_KEY)
        if record is not None and record.observation_tokens > CONFIG['reflection']['observationTokens']:
            return
    raise AssertionError('observations never passed the reflection threshold')


def test_reflection_tasks_check_reflect_validate_commit(aws):
    # Given observations over the reflection threshold
    _grow_observations_past_the_reflection_threshold()
    before = _wiring.store().get_record(RECORD_KEY)
    assert before is not None
    owner = 'reflect-test-1'
    # When the workflow's tasks run in order, as the state machine calls them
    check = invoke('reflection', _reflection_event('check', owner))
    reflect = invoke('reflection', _reflection_event('reflect', owner))
    validate = invoke('reflection', _reflection_event('validate', owner))
    commit = invoke('reflection', _reflection_event('commit', owner))
    # Then a smaller next generation replaced the log and the lease is gone
    assert check['due'] is True
    assert reflect['outcome'] == 'reflected'
    assert validate['valid'] is True
    assert commit['outcome'] == 'committed' and commit['generation'] == before.generation + 1
    after = _wiring.store().get_record(RECORD_KEY)
    assert after is not None and after.generation == before.generation + 1
    assert after.observation_tokens < before.observation_tokens
    assert after.reflecting is None


def test_reflection_validate_without_the_lease_raises_by_class_name(aws):
    # Given no reflection in progress
    _grow_observations_past_the_reflection_threshold()
    # When validate runs for an owner that holds no lease
    # Then it raises: Lambda reports the class name as the error type, which the ASL's Catch routes to Release
    from om_lib.engine.engine import ReflectionRejectedError

    with pytest.raises(ReflectionRejectedError):
        invoke('reflection', _reflection_event('validate', 'nobody'))
    assert invoke('reflection', _reflection_event('release', 'nobody')) == {'released': True}


def test_reflection_task_refuses_an_unknown_task(aws):
    with pytest.raises(ValueError, match='task'):
        invoke('reflection', {'task': 'dance', 'job': {}, 'owner': 'x'})


# ---------------------------------------------------------------------------------------------------------------------
# sweeper
# ---------------------------------------------------------------------------------------------------------------------
def test_sweeper_submits_jobs_for_due_records(aws):
    # Given a backlog that was never queued, in a thread quiet for an hour
    sqs, url = aws
    _conversation(4, ago=timedelta(hours=1))
    # When the schedule fires
    result = invoke('sweeper', load_event('sweeper', 'schedule'))
    # Then the sweeper queued an observation job for it
    assert result == {'submitted': 1}
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)['Messages']
    assert [json.loads(m['Body'])['kind'] for m in messages] == ['observe']


def test_buffered_reflection_through_the_reflection_function_is_staged_then_activated_by_a_step(aws, monkeypatch):
    # Given buffering on and observations past observationTokens × reflection.bufferActivation (300 × 0.5)
    config = {
        'model': 'default',
        'observation': {'messageTokens': 2000, 'bufferTokens': 400},
        'reflection': {'observationTokens': 300, 'bufferActivation': 0.5},
    }
    monkeypatch.setenv('OM_CONFIG', json.dumps(config))
    _wiring.reset()
    engine = _wiring.engine()
    engine.prepare_step(RESOURCE, THREAD, [_say(0, 'Hello there.')])
    lines = [
        f'* 🟡 (09:{i:02d}) Fact {i}: the blue folder {i} holds invoice {1000 + i} for client Ortega.' for i in range(6)
    ]
    record = engine.store.get_record(RECORD_KEY)
    text = 'Date: Mar 3, 2025\n' + '\n'.join(lines)
    record = engine.store.put_record(
        record.model_copy(
            update={'active_observations': text, 'observation_tokens': engine.counter.count_observations(text)}
        ),
        expected_version=record.version,
    )
    assert 150 <= record.observation_tokens < 300, record.observation_tokens
    job = {
        'kind': 'reflect',
        'resourceId': RESOURCE,
        'threadId': THREAD,
        'recordKey': RECORD_KEY,
        'reason': 'buffer',
        'cycleId': 'buffer-refl-it',
    }
    owner = 'execution-it'

    # When the state machine's tasks run for a buffered reflection
    results = [
        invoke('reflection', {'task': t, 'job': job, 'owner': owner})
        for t in ('check', 'reflect', 'validate', 'commit')
    ]

    # Then the result is staged, the workflow's lease is released, and `reflecting` was never held
    assert results[0]['due'] is True and results[1]['outcome'] == 'reflected' and results[3]['outcome'] == 'staged'
    staged = engine.store.get_record(RECORD_KEY)
    assert staged.buffered_reflection and staged.buffered_reflection_cycle_id == 'buffer-refl-it'
    assert staged.buffering_reflection is None and staged.reflecting is None
    # When more lines push the log past the threshold and a step runs
    more = (
        staged.active_observations
        + '\n'
        + '\n'.join(
            f'* 🔴 (10:{i:02d}) Later fact {i}: client Ortega paid invoice {2000 + i} by wire.' for i in range(6)
        )
    )
    engine.store.put_record(
        staged.model_copy(
            update={'active_observations': more, 'observation_tokens': engine.counter.count_observations(more)}
        ),
        expected_version=staged.version,
    )
    result = engine.prepare_step(RESOURCE, THREAD, [_say(1, 'Anything new?')])
    # Then it activates with the buffering's cycle id, the end part reaches the client, later lines are kept
    by_type = {p['type']: p['data'] for p in result.parts.to_json()}
    assert by_type['data-om-activation']['cycleId'] == 'buffer-refl-it'
    assert by_type['data-om-buffering-end']['operationType'] == 'reflection'
    # with the seed's `observations`: the staged reflection it produced (issue 21 item 10)
    assert by_type['data-om-buffering-end']['observations'] == staged.buffered_reflection
    head = engine.store.get_record(RECORD_KEY)
    assert head.generation == staged.generation + 1
    assert 'Later fact 5: client Ortega paid invoice 2005 by wire.' in head.active_observations
    assert head.background_parts == ()


def test_orphan_uploads_sample_event_deletes_an_upload_of_an_erased_thread_and_keeps_a_live_ones(aws):
    from om_lib.adapters.aws.s3 import attachment_key
    from om_lib.uploads import Upload, incarnation

    s3 = boto3.client('s3')
    event = load_event('orphan_uploads', 'object_created')
    key = json.loads(event['Records'][0]['body'])['detail']['object']['key']
    # The sample event's upload: its thread does not exist (erased), so the object goes
    s3.put_object(Bucket=BUCKET, Key=key, Body=b'%PDF-1.4 hello')
    assert invoke('orphan_uploads', event) == {'batchItemFailures': []}
    assert s3.list_objects_v2(Bucket=BUCKET).get('KeyCount') == 0
    # An upload for the thread as it is now stays; a malformed record is reported for redelivery
    thread = _wiring.store().create_thread(RESOURCE, THREAD, now=datetime.now(UTC))
    live = attachment_key(Upload(RESOURCE, THREAD, incarnation(thread)), 'a.pdf', '0' * 32)
    s3.put_object(Bucket=BUCKET, Key=live, Body=b'ok')
    records = [copy.deepcopy(r) for r in event['Records'] * 2]
    body = json.loads(records[0]['body'])
    body['detail']['object']['key'] = live
    records[0]['body'] = json.dumps(body)
    records[1].update(messageId='broken', body='{"not": "an S3 event"}')
    assert invoke('orphan_uploads', {'Records': records}) == {'batchItemFailures': [{'itemIdentifier': 'broken'}]}
    assert [o['Key'] for o in s3.list_objects_v2(Bucket=BUCKET)['Contents']] == [live]

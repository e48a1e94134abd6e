"""The orphan-upload cleanup in the template: the bucket reports new objects to EventBridge, one rule sends the
attachment uploads (the pattern the local stack uses too) to an encrypted queue only it may write, and a function that
may read threads and delete their objects, nothing else, consumes it."""

from __future__ import annotations

import json
from typing import Any

from functions.orphan_uploads.events import object_created_pattern
from infra.constants import ORPHAN_UPLOADS_FUNCTION, UPLOAD_EVENTS_MAX_CONCURRENCY, UPLOAD_EVENTS_MAX_RECEIVES
from tests.infra.conftest import Resources, as_list, of_type, role_of, role_statements


def _one(resources: Resources, kind: str, prefix: str) -> tuple[str, dict[str, Any]]:
    (found,) = [(k, r['Properties']) for k, r in resources.items() if r['Type'] == kind and k.startswith(prefix)]
    return found


def test_the_bucket_reports_new_objects_and_one_rule_forwards_attachment_uploads(resources: Resources) -> None:
    ((bucket_id, bucket),) = of_type(resources, 'AWS::S3::Bucket').items()
    assert bucket['NotificationConfiguration'] == {'EventBridgeConfiguration': {'EventBridgeEnabled': True}}
    (rule,) = of_type(resources, 'AWS::Events::Rule').values()
    # The pattern is the one the local stack installs, naming this bucket
    assert rule['EventPattern'] == object_created_pattern({'Ref': bucket_id})  # type: ignore[arg-type]
    assert rule['Name'] == 'om-memory-dev-orphan-uploads'  # named: the key policy names its ARN
    queue_id, queue = _one(resources, 'AWS::SQS::Queue', 'OrphanUploadCleanupQueue')
    (target,) = rule['Targets']
    assert target['Arn'] == {'Fn::GetAtt': [queue_id, 'Arn']}


def test_only_that_rule_may_send_to_the_queue_which_is_encrypted_and_dead_letters(resources: Resources) -> None:
    queue_id, queue = _one(resources, 'AWS::SQS::Queue', 'OrphanUploadCleanupQueue')
    dlq_id, _ = _one(resources, 'AWS::SQS::Queue', 'OrphanUploadCleanupDeadLetterQueue')
    (key,) = of_type(resources, 'AWS::KMS::Key')
    assert queue['KmsMasterKeyId'] == {'Fn::GetAtt': [key, 'Arn']}
    assert queue['RedrivePolicy'] == {
        'deadLetterTargetArn': {'Fn::GetAtt': [dlq_id, 'Arn']},
        'maxReceiveCount': UPLOAD_EVENTS_MAX_RECEIVES,
    }
    (policy,) = [p for p in of_type(resources, 'AWS::SQS::QueuePolicy').values() if p['Queues'] == [{'Ref': queue_id}]]
    allows = [s for s in policy['PolicyDocument']['Statement'] if s['Effect'] == 'Allow']
    assert [(s['Principal'], s['Action']) for s in allows] == [({'Service': 'events.amazonaws.com'}, 'sqs:SendMessage')]
    assert '-orphan-uploads' in json.dumps(allows[0]['Condition']['ArnEquals']['aws:SourceArn'])
    # The dead-letter queue is alarmed
    alarms = of_type(resources, 'AWS::CloudWatch::Alarm').values()
    assert any(json.dumps({'Fn::GetAtt': [dlq_id, 'QueueName']}) in json.dumps(a.get('Dimensions')) for a in alarms)


def test_the_function_reads_threads_and_deletes_their_objects_and_nothing_else(resources: Resources) -> None:
    role = role_of(resources, ORPHAN_UPLOADS_FUNCTION)
    statements = role_statements(resources, role)
    by_action = {a: s['Resource'] for s in statements for a in as_list(s['Action'])}
    assert by_action['dynamodb:GetItem'] == {
        'Fn::GetAtt': [next(iter(of_type(resources, 'AWS::DynamoDB::GlobalTable'))), 'Arn']
    }
    (bucket_id,) = of_type(resources, 'AWS::S3::Bucket')
    threads_only = {'Fn::Join': ['', [{'Fn::GetAtt': [bucket_id, 'Arn']}, '/*/threads/*']]}
    assert by_action['s3:GetObject'] == by_action['s3:DeleteObject'] == threads_only
    writes = {'s3:PutObject', 's3:ListBucket', 'dynamodb:PutItem', 'dynamodb:UpdateItem', 'dynamodb:DeleteItem'}
    assert not writes & set(by_action)
    assert not [
        a for a in by_action if a.startswith(('secretsmanager:', 'states:', 'bedrock:')) or a == 'sqs:SendMessage'
    ]
    # It consumes the upload events through its alias, a few invocations at most, reporting partial failures
    queue_id, _ = _one(resources, 'AWS::SQS::Queue', 'OrphanUploadCleanupQueue')
    (mapping,) = [
        m
        for m in of_type(resources, 'AWS::Lambda::EventSourceMapping').values()
        if m['EventSourceArn'] == {'Fn::GetAtt': [queue_id, 'Arn']}
    ]
    assert mapping['FunctionResponseTypes'] == ['ReportBatchItemFailures']
    assert mapping['ScalingConfig'] == {'MaximumConcurrency': UPLOAD_EVENTS_MAX_CONCURRENCY}
    assert 'OrphanUploadsFunctionAlias' in json.dumps(mapping['FunctionName'])

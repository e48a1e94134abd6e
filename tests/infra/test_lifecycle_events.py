"""The lifecycle event bus in the template: encrypted with the stack's key (EventBridge may use it for that bus only),
its undeliverable events in an alarmed dead-letter queue, `events:PutEvents` on that bus for the functions that make
memory outcomes and for no one else, its name in their environment; and the optional queue behind a rule."""

from __future__ import annotations

import json
from typing import Any

from infra.constants import (
    ALL_FUNCTIONS,
    LIFECYCLE_QUEUE_MAX_RECEIVES,
    ORPHAN_UPLOADS_FUNCTION,
    SWEEPER_FUNCTION,
)
from om_lib.events import EVENT_SOURCE, lifecycle_event_pattern
from tests.infra.conftest import Resources, as_list, of_type, role_of, role_statements

PUBLISHERS = {'ApiFunction', 'ChatStreamFunction', 'BufferWorkerFunction', 'ReflectionFunction'}


def _bus(resources: Resources) -> tuple[str, dict[str, Any]]:
    ((bus_id, bus),) = of_type(resources, 'AWS::Events::EventBus').items()
    return bus_id, bus


def _bus_arn_text(resources: Resources) -> str:
    """The bus ARN as the grants write it (formatted from its name: `...:event-bus/om-memory-dev-lifecycle`)."""
    return 'event-bus/om-memory-dev-lifecycle'


def test_the_bus_is_named_for_the_stack_encrypted_with_its_key_and_dead_letters(resources: Resources) -> None:
    _, bus = _bus(resources)
    (key,) = of_type(resources, 'AWS::KMS::Key')
    assert bus['Name'] == 'om-memory-dev-lifecycle'
    assert bus['KmsKeyIdentifier'] == {'Fn::GetAtt': [key, 'Arn']}
    dlq_id = bus['DeadLetterConfig']['Arn']['Fn::GetAtt'][0]
    dlq = of_type(resources, 'AWS::SQS::Queue')[dlq_id]
    assert dlq['KmsMasterKeyId'] == {'Fn::GetAtt': [key, 'Arn']}
    # Only this bus may send to its dead-letter queue, over TLS.
    (policy,) = [p for p in of_type(resources, 'AWS::SQS::QueuePolicy').values() if p['Queues'] == [{'Ref': dlq_id}]]
    allows = [s for s in policy['PolicyDocument']['Statement'] if s['Effect'] == 'Allow']
    assert [(s['Principal'], s['Action']) for s in allows] == [({'Service': 'events.amazonaws.com'}, 'sqs:SendMessage')]
    assert _bus_arn_text(resources) in json.dumps(allows[0]['Condition']['ArnEquals']['aws:SourceArn'])
    alarms = of_type(resources, 'AWS::CloudWatch::Alarm').values()
    assert any(json.dumps({'Fn::GetAtt': [dlq_id, 'QueueName']}) in json.dumps(a.get('Dimensions')) for a in alarms)


def test_eventbridge_may_use_the_key_for_this_bus_only(resources: Resources) -> None:
    (key,) = of_type(resources, 'AWS::KMS::Key').values()
    statements = [s for s in key['KeyPolicy']['Statement'] if s['Principal'].get('Service') == 'events.amazonaws.com']
    bus_use = [s for s in statements if 'kms:EncryptionContext:aws:events:event-bus:arn' in json.dumps(s)]
    (bus,) = bus_use
    assert set(as_list(bus['Action'])) == {'kms:Decrypt', 'kms:GenerateDataKey'}
    context = json.dumps(bus['Condition']['StringEquals']['kms:EncryptionContext:aws:events:event-bus:arn'])
    assert _bus_arn_text(resources) in context
    assert _bus_arn_text(resources) in json.dumps(bus['Condition']['ArnEquals']['aws:SourceArn'])
    # Every EventBridge statement names a source (this bus, the upload rule) or is DescribeKey for this account.
    for statement in statements:
        if as_list(statement['Action']) == ['kms:DescribeKey']:
            assert 'aws:SourceAccount' in json.dumps(statement['Condition'])
        else:
            assert 'aws:SourceArn' in json.dumps(statement['Condition'])


def test_only_the_functions_that_make_outcomes_may_publish_and_only_to_this_bus(resources: Resources) -> None:
    for spec in ALL_FUNCTIONS:
        statements = role_statements(resources, role_of(resources, spec))
        publishing = [s for s in statements if 'events:PutEvents' in as_list(s['Action'])]
        if spec.construct_id in PUBLISHERS:
            (grant,) = publishing
            assert as_list(grant['Action']) == ['events:PutEvents']
            (resource,) = as_list(grant['Resource'])
            assert _bus_arn_text(resources) in json.dumps(resource), spec.construct_id
            assert '*' not in json.dumps(resource).replace('${', '')
        else:
            assert publishing == [], spec.construct_id
        # No role may manage the bus, its rules or its targets.
        actions = {a for s in statements for a in as_list(s['Action'])}
        assert not {a for a in actions if a.startswith('events:') and a != 'events:PutEvents'}, spec.construct_id
    assert {s.construct_id for s in (SWEEPER_FUNCTION, ORPHAN_UPLOADS_FUNCTION)}.isdisjoint(PUBLISHERS)


def test_the_publishers_are_told_the_bus_and_no_one_else_is(resources: Resources) -> None:
    for spec in ALL_FUNCTIONS:
        (function,) = [f for f in of_type(resources, 'AWS::Lambda::Function').values() if f['Handler'] == spec.handler]
        env = function['Environment']['Variables']
        if spec.construct_id in PUBLISHERS:
            assert env['OM_EVENT_BUS_NAME'] == 'om-memory-dev-lifecycle', spec.construct_id
        else:
            assert 'OM_EVENT_BUS_NAME' not in env, spec.construct_id


def test_without_the_queue_option_no_rule_reads_the_bus(resources: Resources, template: Any) -> None:
    bus_id, _ = _bus(resources)
    assert not [r for r in of_type(resources, 'AWS::Events::Rule').values() if r.get('EventBusName') == {'Ref': bus_id}]
    outputs = template.to_json()['Outputs']
    assert {'LifecycleEventBusName', 'LifecycleEventBusArn'} <= set(outputs)
    assert 'LifecycleEventsQueueUrl' not in outputs


def test_the_optional_queue_takes_every_event_through_one_rule_only(variant: Resources, variant_stack: Any) -> None:
    bus_id, _ = _bus(variant)
    (rule,) = [r for r in of_type(variant, 'AWS::Events::Rule').values() if r.get('EventBusName') == {'Ref': bus_id}]
    assert rule['EventPattern'] == lifecycle_event_pattern() == {'source': [EVENT_SOURCE]}
    (target,) = rule['Targets']
    queue_id = target['Arn']['Fn::GetAtt'][0]
    queue = of_type(variant, 'AWS::SQS::Queue')[queue_id]
    assert queue['RedrivePolicy']['maxReceiveCount'] == LIFECYCLE_QUEUE_MAX_RECEIVES
    (policy,) = [p for p in of_type(variant, 'AWS::SQS::QueuePolicy').values() if p['Queues'] == [{'Ref': queue_id}]]
    allows = [s for s in policy['PolicyDocument']['Statement'] if s['Effect'] == 'Allow']
    assert len(allows) == 1 and allows[0]['Principal'] == {'Service': 'events.amazonaws.com'}
    source = json.dumps(allows[0]['Condition']['ArnEquals']['aws:SourceArn'])
    assert 'rule/om-memory-dev-lifecycle/om-memory-dev-lifecycle-events' in source
    assert 'LifecycleEventsQueueUrl' in variant_stack[1].to_json()['Outputs']

"""OrphanUploadCleanup: a presigned upload that lands after its thread was erased is deleted as soon as S3 reports it.

S3 sends `Object Created` to EventBridge (the bucket's EventBridge notifications); a rule keeps the attachment uploads
(`functions/orphan_uploads/events.py`, the same pattern the local stack uses) and puts them on an encrypted queue,
whose consumer is the orphan-upload function: it deletes an upload whose thread is gone or was created again since
the URL was issued. The queue buffers a burst and retries a failed delete; after a few failed receives an event goes
to the dead-letter queue (alarmed).
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions.orphan_uploads.events import object_created_pattern
from infra.constants import (
    DLQ_RETENTION_DAYS,
    KMS_DECRYPT_ACTIONS,
    QUEUE_RETENTION_DAYS,
    QUEUE_VISIBILITY_FACTOR,
    UPLOAD_EVENTS_BATCH_SIZE,
    UPLOAD_EVENTS_MAX_CONCURRENCY,
    UPLOAD_EVENTS_MAX_RECEIVES,
)
from infra.constructs.memory_bucket import MemoryBucket
from infra.constructs.memory_key import SQS, MemoryKey


class OrphanUploadCleanup(Construct):
    """The bucket's upload events → rule → queue (and DLQ) → the orphan-upload function's alias."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: MemoryBucket,
        function: lambda_.IFunction,
        role: iam.IRole,
        consumer_timeout: Duration,
        key: MemoryKey,
    ) -> None:
        super().__init__(scope, construct_id)
        bucket.report_new_objects_to_eventbridge()
        self.dead_letter_queue = key.new_queue(
            self,
            'DeadLetterQueue',
            retention_days=DLQ_RETENTION_DAYS,
        )
        self.queue = key.new_queue(
            self,
            'Queue',
            retention_days=QUEUE_RETENTION_DAYS,
            visibility_timeout=Duration.seconds(consumer_timeout.to_seconds() * QUEUE_VISIBILITY_FACTOR),
            dead_letter_queue=sqs.DeadLetterQueue(
                max_receive_count=UPLOAD_EVENTS_MAX_RECEIVES, queue=self.dead_letter_queue
            ),
        )
        pattern = object_created_pattern(bucket.bucket.bucket_name)
        # Named, so the key policy can name its ARN without referring to the rule (the rule's pattern names the
        # bucket, and the bucket is encrypted with the key: a reference would close a dependency cycle).
        stack = Stack.of(self)
        rule_name = f'{stack.stack_name}-orphan-uploads'
        rule_arn = stack.format_arn(service='events', resource='rule', resource_name=rule_name)
        self.rule = events.Rule(
            self,
            'UploadCreated',
            rule_name=rule_name,
            description='New attachment uploads of the memory bucket, for the orphan-upload function',
            event_pattern=events.EventPattern(
                source=pattern['source'], detail_type=pattern['detail-type'], detail=pattern['detail']
            ),
        )
        # The target by hand: CDK's SqsQueue target would let every EventBridge rule send to the queue; this one lets
        # this rule only.
        cfn_rule = self.rule.node.default_child
        assert isinstance(cfn_rule, events.CfnRule)
        cfn_rule.targets = [events.CfnRule.TargetProperty(id='UploadsQueue', arn=self.queue.queue_arn)]
        self.queue.add_to_resource_policy(
            iam.PolicyStatement(
                sid='TheUploadRuleSendsEvents',
                principals=[iam.ServicePrincipal('events.amazonaws.com')],
                actions=['sqs:SendMessage'],
                resources=[self.queue.queue_arn],
                conditions={'ArnEquals': {'aws:SourceArn': rule_arn}},
            )
        )
        # The queue is encrypted with the stack's key, whose policy names every user: EventBridge, for this rule only.
        key.allow_eventbridge_rule('EventBridgeQueuesUploadEvents', rule_arn)
        function.add_event_source(
            event_sources.SqsEventSource(
                self.queue,
                batch_size=UPLOAD_EVENTS_BATCH_SIZE,
                max_concurrency=UPLOAD_EVENTS_MAX_CONCURRENCY,
                report_batch_item_failures=True,
            )
        )
        key.allow('OrphanUploadsFunctionReceivesEvents', role, KMS_DECRYPT_ACTIONS, [SQS])

    @property
    def dead_letter_queues(self) -> list[sqs.IQueue]:
        """Its dead-letter queue (alarmed with the others)."""
        return [self.dead_letter_queue]

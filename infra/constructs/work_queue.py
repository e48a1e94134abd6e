"""WorkQueue: the FIFO queue of observation jobs (one message group per memory record) and its dead-letter queue."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.constants import (
    DLQ_RETENTION_DAYS,
    QUEUE_MAX_RECEIVES,
    QUEUE_RETENTION_DAYS,
    QUEUE_SEND_ACTIONS,
    QUEUE_VISIBILITY_FACTOR,
)


class WorkQueue(Construct):
    """Encrypted (SSE-SQS), TLS only; after `QUEUE_MAX_RECEIVES` failed receives a job moves to the DLQ."""

    def __init__(self, scope: Construct, construct_id: str, *, consumer_timeout: Duration) -> None:
        super().__init__(scope, construct_id)
        self.dead_letter_queue = sqs.Queue(
            self,
            'DeadLetterQueue',
            fifo=True,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(DLQ_RETENTION_DAYS),
        )
        self.queue = sqs.Queue(
            self,
            'Queue',
            fifo=True,
            # High-throughput FIFO: ordering and de-duplication per record, not across the whole queue.
            deduplication_scope=sqs.DeduplicationScope.MESSAGE_GROUP,
            fifo_throughput_limit=sqs.FifoThroughputLimit.PER_MESSAGE_GROUP_ID,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(QUEUE_RETENTION_DAYS),
            # AWS: at least six times the consumer's timeout, so retries of a throttled batch stay invisible.
            visibility_timeout=Duration.seconds(consumer_timeout.to_seconds() * QUEUE_VISIBILITY_FACTOR),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=QUEUE_MAX_RECEIVES, queue=self.dead_letter_queue),
        )

    def grant_submit(self, grantee: iam.IGrantable) -> None:
        """Send jobs (explicit action; SSE-SQS needs no KMS permission)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=list(QUEUE_SEND_ACTIONS), resource_arns=[self.queue.queue_arn]
        )

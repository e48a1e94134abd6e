"""WorkQueue: the FIFO queue of observation jobs (one message group per memory record) and its dead-letter queue."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.constants import (
    DLQ_RETENTION_DAYS,
    KMS_DECRYPT_ACTIONS,
    KMS_ENCRYPT_DECRYPT_ACTIONS,
    QUEUE_MAX_RECEIVES,
    QUEUE_RETENTION_DAYS,
    QUEUE_SEND_ACTIONS,
    QUEUE_VISIBILITY_FACTOR,
)
from infra.constructs.memory_key import SQS, MemoryKey


class WorkQueue(Construct):
    """Encrypted with the stack's key, TLS only; after `QUEUE_MAX_RECEIVES` failed receives a job moves to the DLQ.

    Jobs are idempotent and the sweeper resubmits work for threads left unobserved, so a dead-lettered job is never
    lost work; redrive (`aws sqs start-message-move-task --source-arn <DLQ arn>`) just runs it sooner.
    """

    def __init__(self, scope: Construct, construct_id: str, *, consumer_timeout: Duration, key: MemoryKey) -> None:
        super().__init__(scope, construct_id)
        self.memory_key = key
        # A data key is reused for this long (fewer KMS calls; AWS's default is 5 minutes, the maximum 24 hours).
        reuse = Duration.hours(1)
        self.dead_letter_queue = key.new_queue(
            self,
            'DeadLetterQueue',
            retention_days=DLQ_RETENTION_DAYS,
            fifo=True,
            data_key_reuse=reuse,
        )
        self.queue = key.new_queue(
            self,
            'Queue',
            retention_days=QUEUE_RETENTION_DAYS,
            fifo=True,
            # High-throughput FIFO: ordering and de-duplication per record, not across the whole queue.
            deduplication_scope=sqs.DeduplicationScope.MESSAGE_GROUP,
            fifo_throughput_limit=sqs.FifoThroughputLimit.PER_MESSAGE_GROUP_ID,
            data_key_reuse=reuse,
            # AWS: at least six times the consumer's timeout, so retries of a throttled batch stay invisible.
            visibility_timeout=Duration.seconds(consumer_timeout.to_seconds() * QUEUE_VISIBILITY_FACTOR),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=QUEUE_MAX_RECEIVES, queue=self.dead_letter_queue),
        )

    @property
    def dead_letter_queues(self) -> list[sqs.IQueue]:
        """Every dead-letter queue of the stack's queues (each gets a depth alarm)."""
        return [self.dead_letter_queue]

    def grant_submit(self, grantee: iam.IRole, *, sid: str) -> None:
        """Send jobs: `sqs:SendMessage` on the work queue, and the key's use through SQS to encrypt them."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=list(QUEUE_SEND_ACTIONS), resource_arns=[self.queue.queue_arn]
        )
        self.memory_key.allow(f'{sid}SendsJobs', grantee, KMS_ENCRYPT_DECRYPT_ACTIONS, [SQS])

    def grant_consume(self, grantee: iam.IRole, *, sid: str) -> None:
        """The event source's receive/delete actions are granted by CDK with it; here the key's use to decrypt."""
        self.memory_key.allow(f'{sid}ReceivesJobs', grantee, KMS_DECRYPT_ACTIONS, [SQS])

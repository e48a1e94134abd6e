"""`AwsBackgroundWork`: observation jobs go to the SQS work queue, reflection jobs start the Step Functions workflow."""

from __future__ import annotations

import hashlib
import json
import random
import string
import threading
import uuid
from typing import TYPE_CHECKING, Any

from om_lib.adapters.aws.errors import aws_errors
from om_lib.work import Job

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient


class AwsBackgroundWork:
    """Submits jobs to AWS. Clients are created lazily and reused by warm invocations (and honour AWS_ENDPOINT_URL)."""

    def __init__(
        self,
        *,
        queue_url: str | None,
        state_machine_arn: str | None,
        sqs_client: SQSClient | None = None,
        sfn_client: SFNClient | None = None,
    ) -> None:
        self.queue_url = queue_url
        self.state_machine_arn = state_machine_arn
        self._sqs = sqs_client
        self._sfn = sfn_client
        self._lock = threading.Lock()

    def _client(self, name: str) -> Any:
        import boto3

        with self._lock:
            if name == 'sqs':
                if self._sqs is None:
                    self._sqs = boto3.client('sqs')
                return self._sqs
            if self._sfn is None:
                self._sfn = boto3.client('stepfunctions')
            return self._sfn

    def submit(self, job: Job) -> None:
        """Send an observe job to the queue, or start a reflection execution (see `BackgroundWork.submit`)."""
        body = json.dumps(job.to_json(), separators=(',', ':'))
        if job.kind == 'reflect' and self.state_machine_arn:
            # The workflow's input is {"job": {...}}; its tasks pass `$.job` and the execution name (the lease owner).
            with aws_errors():
                self._client('sfn').start_execution(
                    stateMachineArn=self.state_machine_arn,
                    name=f'reflect-{uuid.uuid4().hex}',
                    input=json.dumps({'job': job.to_json()}, separators=(',', ':')),
                )
            return
        if not self.queue_url:
            return
        params: dict[str, Any] = {'QueueUrl': self.queue_url, 'MessageBody': body}
        if self.queue_url.endswith('.fifo'):
            # One group per record: its jobs run in order, different records in parallel.
            params['MessageGroupId'] = message_group_id(job.record_key)
            # A fresh id per job: FIFO de-duplication would drop a later job that covers newer messages, and jobs
            # are idempotent anyway (the worker re-reads the record).
            params['MessageDeduplicationId'] = uuid.uuid4().hex
            if job.kind == 'buffer':
                # A buffering job is one message range: the same slice sent twice within SQS's 5-minute window is
                # dropped by the queue (the worker's conditional write makes a later duplicate a no-op too).
                params['MessageDeduplicationId'] = hashlib.sha256(job.dedup_key.encode()).hexdigest()
        with aws_errors():
            self._client('sqs').send_message(**params)

    def delay_redelivery(self, receipt_handle: str, receive_count: int) -> int:
        """Keep a failed job's message invisible for `retry_delay_s(receive_count)` before the work queue delivers it
        again; returns the delay. Best effort: when it fails (StorageError), the queue's own visibility timeout applies.

        Uses the client that submits jobs, so a worker failing job after job in a model outage builds no client.
        """
        delay = retry_delay_s(receive_count)
        with aws_errors():
            self._client('sqs').change_message_visibility(
                QueueUrl=self.queue_url or '', ReceiptHandle=receipt_handle, VisibilityTimeout=delay
            )
        return delay


# A job that failed because the model was unavailable comes back after this long (doubling per receive, jittered),
# so a brown-out does not turn into a redelivery every visibility timeout.
RETRY_BASE_S = 30
RETRY_MAX_S = 900
_jitter = random.SystemRandom()


def retry_delay_s(receive_count: int) -> int:
    """How long a failed job waits before its next delivery: 30 s doubling per receive up to 15 min, full jitter on
    the top half (so a thousand threads' jobs do not come back in the same second)."""
    ceiling = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** max(0, receive_count - 1))
    return int(_jitter.uniform(ceiling / 2, ceiling))


# SQS takes 1-128 characters of ASCII letters, digits and punctuation as a message group id.
_GROUP_ID_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)


def message_group_id(record_key: str) -> str:
    """The FIFO group of a record's jobs: the record key itself when SQS accepts it, else its SHA-256.

    A record key holds two ids of up to 128 characters each, which may be non-ASCII letters (`om_lib.ids`).
    """
    if len(record_key) <= 128 and set(record_key) <= _GROUP_ID_CHARS:
        return record_key
    return hashlib.sha256(record_key.encode()).hexdigest()

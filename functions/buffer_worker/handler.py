"""Buffer worker: SQS (FIFO, one message group per memory record) → `engine.run_job` for each job (buffer, observe).

Partial batch responses: only the records that failed are redelivered. A malformed body fails every time, so after
the queue's maxReceiveCount it lands in the dead-letter queue for a human; a job whose thread was erased meanwhile
succeeds with nothing to do. Jobs are idempotent (run_job re-reads the record), so redelivery is harmless.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import _wiring
from functions._observability import logger, metrics, record_parts_metrics, traced
from om_lib.errors import ErasedError, OMError, ThreadNotFoundError
from om_lib.work import Job

# A failing record holds back only the later jobs of its own group (its record stays in order); other groups run.
processor = SqsFifoPartialProcessor(skip_group_on_error=True)
# A batch whose records all failed is reported like any other (every id in batchItemFailures) instead of raising: the
# outcome for SQS is the same, but a raise would count as a Lambda error and page someone for one bad message.
processor.raise_on_entire_batch_failure = False
# run_job reports a failed model call as a part (the request path must not raise); here it must be redelivered.
_RETRY_REASONS = frozenset({'error', 'timeout', 'model_unavailable'})


# Lambda init, snapshotted by SnapStart: the engine, its clients and the tokenizer (every job counts tokens), and the
# model SDK when snapshotted (on demand it loads on the first model call). Only inside Lambda: importing this module in
# a test or a tool must work without the service's environment.
if os.environ.get('AWS_LAMBDA_FUNCTION_NAME'):
    try:
        _wiring.init()
    except Exception:  # the first request retries the setup and fails with the error then
        logger.exception('init failed')


DEADLINE_MARGIN_S = 15.0


class MalformedJobError(ValueError):
    """The message body is not a Job; it fails until the queue moves it to the dead-letter queue."""


class JobIncompleteError(OMError):
    """The job's model call failed; SQS redelivers the message after its visibility timeout."""

    retryable = True
    code = 'job_incomplete'


def record_handler(record: SQSRecord, lambda_context: LambdaContext | None = None) -> None:
    # The job's deadline is what the invocation has left (minus a margin to report partial failures), so a slow model
    # never times out the whole batch and takes finished records down with it.
    deadline = None
    if lambda_context is not None:
        deadline = time.monotonic() + max(1.0, lambda_context.get_remaining_time_in_millis() / 1000 - DEADLINE_MARGIN_S)
    try:
        job = Job.from_json(json.loads(record.body))
    except (ValueError, KeyError, TypeError) as exc:
        logger.error('malformed job', message_id=record.message_id, error=str(exc))
        raise MalformedJobError(f'message {record.message_id} is not a job: {exc}') from exc
    try:
        parts = _wiring.service().run_job(job, deadline=deadline)
    except (ThreadNotFoundError, ErasedError):
        logger.info('thread is gone; nothing to do', record_key=job.record_key, kind=job.kind)
        return
    except OMError as exc:
        logger.warning('job failed', record_key=job.record_key, kind=job.kind, retryable=exc.retryable, error=str(exc))
        raise
    record_parts_metrics(parts.to_json())
    failed = parts.failures()
    for data in failed:
        # Say why, in the log as in the part the client gets on its next step.
        logger.warning(
            f'{job.kind} job failed: {data.get("reason")}: {data.get("error")}',
            record_key=job.record_key,
            kind=job.kind,
            operation=data.get('operationType'),
            reason=data.get('reason'),
        )
    if any(data.get('reason') in _RETRY_REASONS for data in failed):
        _back_off(record)
        raise JobIncompleteError(f'{job.kind} of {job.record_key} failed: {failed[-1].get("error")}')


def _back_off(record: SQSRecord) -> None:
    """The model failed: come back later, later each time (SQS visibility, exponential with jitter), not on every
    visibility timeout while the model is down."""
    work = _wiring.background_work()
    if not work.queue_url:
        return
    try:
        delay = work.delay_redelivery(record.receipt_handle, int(record.attributes.approximate_receive_count))
    except OMError:
        logger.warning('could not delay the redelivery; the queue timeout applies', message_id=record.message_id)
        return
    logger.info('job comes back later', message_id=record.message_id, delay_s=delay)


@logger.inject_lambda_context
@metrics.log_metrics
@traced
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)

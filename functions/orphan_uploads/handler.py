"""Orphan uploads: S3 (EventBridge `Object Created`) → SQS → this function, which deletes an attachment upload whose
thread is gone, or is another thread of the same id (erased and created again after the URL was issued).

A presigned upload URL (`POST /attachments`) keeps working after the thread or resource it was issued for is erased;
this is what makes that erase final. Each SQS record's body is one EventBridge event; a record whose check or delete
failed is redelivered (partial batch responses), and after the queue's maxReceiveCount it lands in the dead-letter
queue. Deleting is idempotent, so redelivery is harmless. It reads one thread item per upload and never loads a model
or the tokenizer.
"""

from __future__ import annotations

import json
import os
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import _wiring
from functions._observability import logger, traced
from om_lib.adapters.aws.s3 import notified_key, parse_attachment_key

processor = BatchProcessor(event_type=EventType.SQS)
processor.raise_on_entire_batch_failure = False

# Lambda init, snapshotted by SnapStart: the store's clients only (no tokenizer, no model SDK). Only inside Lambda.
if os.environ.get('AWS_LAMBDA_FUNCTION_NAME'):
    try:
        _wiring.init(tokenizer=False, models=False)
    except Exception:  # the first event retries the setup and fails with the error then
        logger.exception('init failed')


class MalformedEventError(ValueError):
    """The record is not an S3 `Object Created` event; it fails until the queue dead-letters it."""


def record_handler(record: SQSRecord) -> None:
    try:
        detail = json.loads(record.body)['detail']
        bucket, key = str(detail['bucket']['name']), notified_key(str(detail['object']['key']))
    except (ValueError, KeyError, TypeError) as exc:
        raise MalformedEventError(f'message {record.message_id} is not an S3 Object Created event: {exc}') from exc
    if bucket != _wiring.settings().OM_BUCKET_NAME:
        logger.warning('an event of another bucket', bucket=bucket)
        return
    upload = parse_attachment_key(key)
    if upload is None:
        logger.info('not an attachment upload; left alone')
        return
    if _wiring.service().upload_outlived_its_thread(upload):
        _wiring.store().blobs.delete([key])
        logger.info('deleted an upload whose thread was erased', thread_id=upload.thread_id)


@logger.inject_lambda_context
@traced
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)

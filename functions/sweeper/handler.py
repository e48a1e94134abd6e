"""Sweeper: the schedule (EventBridge) → `engine.sweep()`, which submits jobs for records that are due or stale.

It is the safety net behind the request path: work that was never queued (a lost submit), a job that ended in the
dead-letter queue, or a lease left by a crashed holder gets picked up here.
"""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import _wiring
from functions._observability import logger, traced

# Lambda init, snapshotted by SnapStart: the engine and its clients only (a sweep reads records and queues jobs; it
# never counts a token or calls a model). Only inside Lambda: importing this module in a test or a tool must work
# without the service's environment.
if os.environ.get('AWS_LAMBDA_FUNCTION_NAME'):
    try:
        _wiring.init(tokenizer=False, models=False)
    except Exception:  # the first request retries the setup and fails with the error then
        logger.exception('init failed')


@logger.inject_lambda_context
@traced
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    jobs = _wiring.service().sweep()
    logger.info('swept', submitted=len(jobs), kinds=sorted({job.kind for job in jobs}))
    return {'submitted': len(jobs)}

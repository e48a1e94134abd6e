"""Sweeper: the schedule (EventBridge) → `engine.sweep()`, which submits jobs for records that are due or stale.

It is the safety net behind the request path: work that was never queued (a lost submit), a job that ended in the
dead-letter queue, or a lease left by a crashed holder gets picked up here.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import _wiring
from functions._observability import logger


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    jobs = _wiring.engine().sweep()
    logger.info('swept', submitted=len(jobs), kinds=sorted({job.kind for job in jobs}))
    return {'submitted': len(jobs)}

"""Reflection workflow task: `{"task", "job", "owner"}` from Step Functions → `engine.workflow_<task>(job, owner)`.

Errors propagate: Lambda reports the exception's class name as the error type, which is what the state machine's
Retry/Catch match on (ModelUnavailableError is retried, ReflectionRejectedError releases the lease, ...).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import _wiring
from functions._observability import logger
from om_lib.work import Job

TASKS = frozenset({'check', 'reflect', 'validate', 'commit', 'release'})


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task, owner = event.get('task'), event.get('owner')
    if task not in TASKS or not isinstance(owner, str) or not owner:
        raise ValueError(f'expected {{"task": one of {sorted(TASKS)}, "job": {{...}}, "owner": "..."}}, got {event!r}')
    job = Job.from_json(event['job'])
    result: dict[str, Any] = getattr(_wiring.engine(), f'workflow_{task}')(job, owner)
    logger.info('reflection task done', task=task, record_key=job.record_key, owner=owner, result=result)
    return result

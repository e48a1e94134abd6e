"""Reflection workflow task: `{"task", "job", "owner"}` from Step Functions → `engine.workflow_<task>(job, owner)`.

`release`, the failure path, also gets `error`: the name of the error that sent the execution there (counted in the
`ReflectionFailures` metric by reason).

Errors propagate: Lambda reports the exception's class name as the error type, which is what the state machine's
Retry/Catch match on (ModelUnavailableError is retried, ReflectionRejectedError releases the lease, ...).
"""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import _wiring
from functions._observability import logger, record_workflow_metrics, traced
from om_lib.work import Job

TASKS = frozenset({'check', 'reflect', 'validate', 'commit', 'release'})


# Lambda init, snapshotted by SnapStart: the engine and its clients; the tokenizer and the model SDK only when
# snapshotted (on demand they load on first use: `check`, every execution's first task, needs neither). Only inside
# Lambda: importing this module in a test or a tool must work without the service's environment.
if os.environ.get('AWS_LAMBDA_FUNCTION_NAME'):
    try:
        _wiring.init(tokenizer=None)
    except Exception:  # the first request retries the setup and fails with the error then
        logger.exception('init failed')


@logger.inject_lambda_context
@traced
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task, owner = event.get('task'), event.get('owner')
    if task not in TASKS or not isinstance(owner, str) or not owner:
        raise ValueError(f'expected {{"task": one of {sorted(TASKS)}, "job": {{...}}, "owner": "..."}}, got {event!r}')
    job = Job.from_json(event['job'])
    result = _wiring.service().workflow_task(task, job, owner)
    record_workflow_metrics(task, result, event.get('error'))
    if task == 'release':
        # The failure path: one line that says what happened in words (the workflow's own failure names no cause).
        logger.warning(
            'reflection not committed; the previous observations were kept (GET …/memory lists why in recentFailures)',
            error=event.get('error'),
            record_key=job.record_key,
        )
    logger.info('reflection task done', task=task, record_key=job.record_key, owner=owner, result=result)
    return result

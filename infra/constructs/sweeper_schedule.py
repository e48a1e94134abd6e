"""SweeperSchedule: EventBridge Scheduler runs the sweeper (which submits due or stale jobs) every few minutes."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from infra.constants import SWEEP_EVERY_MINUTES


class SweeperSchedule(Construct):
    """A rate schedule invoking the sweeper's alias; no retries: the next run comes within minutes anyway."""

    def __init__(self, scope: Construct, construct_id: str, *, sweeper: lambda_.IFunction) -> None:
        super().__init__(scope, construct_id)
        # The schedule invokes asynchronously; Lambda's own retries of a failed sweep would only overlap the next one.
        sweeper.configure_async_invoke(retry_attempts=0, max_event_age=Duration.minutes(SWEEP_EVERY_MINUTES))
        self.schedule = scheduler.Schedule(
            self,
            'Schedule',
            description='Runs the observational memory sweeper',
            schedule=scheduler.ScheduleExpression.rate(Duration.minutes(SWEEP_EVERY_MINUTES)),
            target=targets.LambdaInvoke(
                sweeper,
                input=scheduler.ScheduleTargetInput.from_object({'source': 'om.schedule', 'task': 'sweep'}),
                retry_attempts=0,
                max_event_age=Duration.minutes(SWEEP_EVERY_MINUTES),
            ),
        )

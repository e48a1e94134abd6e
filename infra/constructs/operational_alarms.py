"""OperationalAlarms: what needs a human, each alarm notifying one encrypted SNS topic (output `AlarmTopicArn`).

- each dead-letter queue holding a job;
- reflection executions that failed, timed out or were aborted;
- each function's errors and throttles;
- the API's 5xx rate and p99 latency;
- observation and reflection failures for the reasons that mean something is broken (`error`, `timeout`), summed
  over the functions that report them (the metrics carry `service` and `reason` dimensions; see
  functions/_observability.py).

Subscribe to the topic, or pass `-c alarmEmail=...`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constants import (
    ALARM_PERIOD_MINUTES,
    ALARMED_FAILURE_REASONS,
    API_5XX_RATE_THRESHOLD,
    API_LATENCY_PERIODS,
    API_P99_LATENCY_MS,
    FUNCTION_ERRORS_THRESHOLD,
    FUNCTION_THROTTLES_THRESHOLD,
    METRICS_NAMESPACE,
    OBSERVATION_FAILURES_METRIC,
    OBSERVATION_FAILURES_THRESHOLD,
    REFLECTION_FAILURES_METRIC,
    REFLECTION_FAILURES_THRESHOLD,
)
from infra.constructs.memory_key import MemoryKey


@dataclass(frozen=True)
class WatchedFunction:
    """A function the alarms watch: its display name, the function and its Powertools service name."""

    name: str
    function: lambda_.IFunction
    service: str
    reports_observations: bool = False
    reports_reflections: bool = False


def failure_metric(name: str, service: str, reason: str, period: Duration) -> cloudwatch.Metric:
    """One failure metric (`ObservationFailures` / `ReflectionFailures`) of one service and reason."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={'service': service, 'reason': reason},
        statistic='Sum',
        period=period,
    )


class OperationalAlarms(Construct):
    """CloudWatch alarms on what needs a human, all notifying `topic` (alarm and OK)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        key: MemoryKey,
        dead_letter_queues: Sequence[sqs.IQueue],
        functions: Sequence[WatchedFunction],
        api: apigw.RestApi,
        state_machine: sfn.StateMachine,
        upload_dead_letter_queues: Sequence[sqs.IQueue] = (),
        event_dead_letter_queues: Sequence[sqs.IQueue] = (),
        email: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        period = Duration.minutes(ALARM_PERIOD_MINUTES)
        # Notifications carry alarm names and states only (no user data); encrypted with the stack's key anyway.
        self.topic = sns.Topic(
            self, 'Topic', display_name='Observational memory alarms', enforce_ssl=True, master_key=key.key
        )
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        self.alarms: list[cloudwatch.Alarm] = []

        for index, queue in enumerate(dead_letter_queues):
            self._add(
                'DeadLetterQueueDepth' + (str(index) if index else ''),
                queue.metric_approximate_number_of_messages_visible(period=period, statistic='Maximum'),
                threshold=1,
                description='Jobs failed repeatedly and wait in the dead-letter queue: find the cause in the buffer '
                'worker log, fix it, then redrive (the sweeper also resubmits work for threads left unobserved).',
            )
        for index, queue in enumerate(upload_dead_letter_queues):
            self._add(
                'UploadEventsDeadLetterQueueDepth' + (str(index) if index else ''),
                queue.metric_approximate_number_of_messages_visible(period=period, statistic='Maximum'),
                threshold=1,
                description='Upload events failed repeatedly: an upload that landed after its thread was erased may '
                "still be in the bucket. Find the cause in the orphan-upload function's log, fix it, then redrive.",
            )
        for index, queue in enumerate(event_dead_letter_queues):
            self._add(
                'LifecycleEventsDeadLetterQueueDepth' + (str(index) if index else ''),
                queue.metric_approximate_number_of_messages_visible(period=period, statistic='Maximum'),
                threshold=1,
                description='Lifecycle events could not be delivered (the bus could not use its key, or the events '
                "queue's consumer kept failing): memory is unaffected; check the key policy or the consumer, then "
                'redrive or read them from the dead-letter queue.',
            )
        for name, metric, what in (
            ('ReflectionExecutionsFailed', state_machine.metric_failed(period=period, statistic='Sum'), 'failed'),
            (
                'ReflectionExecutionsTimedOut',
                state_machine.metric_timed_out(period=period, statistic='Sum'),
                'timed out',
            ),
            (
                'ReflectionExecutionsAborted',
                state_machine.metric_aborted(period=period, statistic='Sum'),
                'was aborted',
            ),
        ):
            self._add(
                name,
                metric,
                threshold=1,
                description=f'A reflection workflow execution {what}: its lease was released and the old observations '
                'kept; see the execution history and the reflection function log.',
            )
        for watched in functions:
            self._add(
                f'{watched.name}Errors',
                watched.function.metric_errors(period=period, statistic='Sum'),
                threshold=FUNCTION_ERRORS_THRESHOLD,
                description=f'The {watched.name} function raised errors (see its log group and traces).',
            )
            self._add(
                f'{watched.name}Throttles',
                watched.function.metric_throttles(period=period, statistic='Sum'),
                threshold=FUNCTION_THROTTLES_THRESHOLD,
                description=f'The {watched.name} function was throttled (reserved or account concurrency reached).',
            )
        self._add(
            'Api5xxRate',
            api.metric_server_error(period=period, statistic='Average'),
            threshold=API_5XX_RATE_THRESHOLD,
            description=f'Over {API_5XX_RATE_THRESHOLD:.0%} of API requests answered 5XX in {ALARM_PERIOD_MINUTES} min '
            '(the API function failed or timed out).',
        )
        self._add(
            'ApiLatencyP99',
            api.metric_latency(period=period, statistic='p99'),
            threshold=API_P99_LATENCY_MS,
            evaluation_periods=API_LATENCY_PERIODS,
            description=f'p99 API latency over {API_P99_LATENCY_MS} ms for {API_LATENCY_PERIODS} periods: steps are '
            'waiting on models (see ModelCalls and the observation latency on the dashboard).',
        )
        for metric_name, threshold, reporters in (
            (
                OBSERVATION_FAILURES_METRIC,
                OBSERVATION_FAILURES_THRESHOLD,
                [f.service for f in functions if f.reports_observations],
            ),
            (
                REFLECTION_FAILURES_METRIC,
                REFLECTION_FAILURES_THRESHOLD,
                [f.service for f in functions if f.reports_reflections],
            ),
        ):
            for reason in ALARMED_FAILURE_REASONS:
                self._add(
                    f'{metric_name}{reason.title()}',
                    self.failures_expression(metric_name, reason, reporters, period),
                    threshold=threshold,
                    description=f'{metric_name} with reason "{reason}" (all functions): model calls are failing '
                    '(provider outage, quota, a bad key) or timing out; the messages stay unobserved, nothing is lost.',
                )

    @staticmethod
    def failures_expression(
        metric_name: str, reason: str, services: Sequence[str], period: Duration
    ) -> cloudwatch.MathExpression:
        """The sum over `services` of one failure metric and reason (a missing series counts as 0)."""
        using = {f'm{i}': failure_metric(metric_name, service, reason, period) for i, service in enumerate(services)}
        return cloudwatch.MathExpression(
            expression=' + '.join(f'FILL({name}, 0)' for name in using),
            using_metrics=using,
            label=f'{metric_name} ({reason})',
            period=period,
        )

    def _add(
        self,
        construct_id: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        description: str,
        evaluation_periods: int = 1,
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        alarm.add_ok_action(actions.SnsAction(self.topic))
        self.alarms.append(alarm)

"""OperationsDashboard: one CloudWatch dashboard with what an operator looks at first.

Rows: steps and their latency; model calls, cycle durations (mostly the model call) and tokens; compression (raw message
tokens per observation token, reflection input per output); failures by reason; backlog (work queue depth and age, the
dead-letter queue, running executions); the functions' errors, throttles and concurrency. The business metrics carry a
`service` dimension (and `reason` for failures), so the widgets search across services.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constants import (
    ALARM_PERIOD_MINUTES,
    METRICS_NAMESPACE,
    OBSERVATION_FAILURES_METRIC,
    REFLECTION_FAILURES_METRIC,
)
from infra.constructs.operational_alarms import WatchedFunction


def _search(metric: str, statistic: str, *, dimensions: str = 'service', label: str = '') -> cloudwatch.MathExpression:
    period = Duration.minutes(ALARM_PERIOD_MINUTES)
    query = f'{{{METRICS_NAMESPACE},{dimensions}}} MetricName="{metric}"'
    expression = f"SEARCH('{query}', '{statistic}', {int(period.to_seconds())})"
    return cloudwatch.MathExpression(expression=expression, label=label or metric, period=period)


class OperationsDashboard(Construct):
    """The dashboard (output `DashboardName`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        api: apigw.RestApi,
        functions: Sequence[WatchedFunction],
        queue: sqs.IQueue,
        dead_letter_queues: Sequence[sqs.IQueue],
        state_machine: sfn.StateMachine,
    ) -> None:
        super().__init__(scope, construct_id)
        period = Duration.minutes(ALARM_PERIOD_MINUTES)
        self.dashboard = cloudwatch.Dashboard(
            self, 'Dashboard', dashboard_name=f'{Stack.of(self).stack_name}-operations'
        )
        width = 8
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title='Steps and API requests',
                width=width,
                left=[
                    _search('StepLatencyMs', 'SampleCount', label='steps'),
                    api.metric_count(period=period, statistic='Sum', label='API requests'),
                ],
            ),
            cloudwatch.GraphWidget(
                title='Step latency (ms): memory work, and the whole request',
                width=width,
                left=[
                    _search('StepLatencyMs', 'p50', label='step p50'),
                    _search('StepLatencyMs', 'p99', label='step p99'),
                    api.metric_latency(period=period, statistic='p99', label='API p99'),
                ],
            ),
            cloudwatch.GraphWidget(
                title='Model calls and cycle duration (ms, mostly the model)',
                width=width,
                left=[_search('ModelCalls', 'Sum', label='model calls')],
                right=[
                    _search('ObservationDurationMs', 'p50', label='observation p50'),
                    _search('ObservationDurationMs', 'p99', label='observation p99'),
                    _search('ReflectionDurationMs', 'p99', label='reflection p99'),
                ],
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title='Tokens',
                width=width,
                left=[
                    _search('TokensObserved', 'Sum', label='message tokens observed'),
                    _search('ObservationTokens', 'Sum', label='observation tokens written'),
                    _search('ReflectionInputTokens', 'Sum', label='reflection input'),
                    _search('ReflectionOutputTokens', 'Sum', label='reflection output'),
                ],
            ),
            cloudwatch.GraphWidget(
                title='Compression (input tokens per output token)',
                width=width,
                left=[
                    cloudwatch.MathExpression(
                        expression='SUM(observed) / SUM(written)',
                        using_metrics={
                            'observed': _search('TokensObserved', 'Sum'),
                            'written': _search('ObservationTokens', 'Sum'),
                        },
                        label='observation',
                        period=period,
                    ),
                    cloudwatch.MathExpression(
                        expression='SUM(rin) / SUM(rout)',
                        using_metrics={
                            'rin': _search('ReflectionInputTokens', 'Sum'),
                            'rout': _search('ReflectionOutputTokens', 'Sum'),
                        },
                        label='reflection',
                        period=period,
                    ),
                ],
            ),
            cloudwatch.GraphWidget(
                title='Failures by reason',
                width=width,
                left=[
                    _search(OBSERVATION_FAILURES_METRIC, 'Sum', dimensions='service,reason'),
                    _search(REFLECTION_FAILURES_METRIC, 'Sum', dimensions='service,reason'),
                ],
            ),
        )
        backlog: list[cloudwatch.IMetric] = [
            queue.metric_approximate_number_of_messages_visible(period=period, statistic='Maximum', label='queued'),
            *(
                dlq.metric_approximate_number_of_messages_visible(
                    period=period, statistic='Maximum', label='dead-lettered'
                )
                for dlq in dead_letter_queues
            ),
        ]
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title='Backlog',
                width=width,
                left=backlog,
                right=[
                    queue.metric_approximate_age_of_oldest_message(
                        period=period, statistic='Maximum', label='oldest job (s)'
                    )
                ],
            ),
            cloudwatch.GraphWidget(
                title='Reflection executions',
                width=width,
                left=[
                    state_machine.metric_started(period=period, statistic='Sum', label='started'),
                    state_machine.metric_succeeded(period=period, statistic='Sum', label='succeeded'),
                    state_machine.metric_failed(period=period, statistic='Sum', label='failed'),
                    state_machine.metric_timed_out(period=period, statistic='Sum', label='timed out'),
                ],
            ),
            cloudwatch.GraphWidget(
                title='Functions: errors, throttles, concurrency',
                width=width,
                left=[
                    metric
                    for watched in functions
                    for metric in (
                        watched.function.metric_errors(period=period, statistic='Sum', label=f'{watched.name} errors'),
                        watched.function.metric_throttles(
                            period=period, statistic='Sum', label=f'{watched.name} throttles'
                        ),
                    )
                ],
                right=[
                    watched.function.metric(
                        'ConcurrentExecutions', period=period, statistic='Maximum', label=f'{watched.name} concurrency'
                    )
                    for watched in functions
                ],
            ),
        )

"""OperationalAlarms: a job in the dead-letter queue, a function error, API Gateway 5XX, a failed reflection.

Every alarm notifies one SNS topic (output `AlarmTopicArn`; subscribe to it, or pass `-c alarmEmail=...`).
"""

from __future__ import annotations

from collections.abc import Sequence

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

from infra.constants import ALARM_PERIOD_MINUTES, FUNCTION_ERRORS_THRESHOLD

API_5XX_THRESHOLD = 5


class OperationalAlarms(Construct):
    """CloudWatch alarms on what needs a human, all notifying `topic`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        dead_letter_queue: sqs.IQueue,
        functions: Sequence[tuple[str, lambda_.IFunction]],
        api: apigw.RestApi,
        state_machine: sfn.StateMachine,
        email: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        period = Duration.minutes(ALARM_PERIOD_MINUTES)
        # Alarm notifications carry alarm names and states only (no user data); see the cdk-nag note in om_stack.
        self.topic = sns.Topic(self, 'Topic', display_name='Observational memory alarms', enforce_ssl=True)
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        self.alarms: list[cloudwatch.Alarm] = []

        self._add(
            'DeadLetterQueueDepth',
            dead_letter_queue.metric_approximate_number_of_messages_visible(period=period, statistic='Maximum'),
            threshold=1,
            description='Observation jobs failed repeatedly and wait in the dead-letter queue: inspect, redrive.',
        )
        for name, function in functions:
            self._add(
                f'{name}Errors',
                function.metric_errors(period=period, statistic='Sum'),
                threshold=FUNCTION_ERRORS_THRESHOLD,
                description=f'The {name} function raised errors (see its log group).',
            )
        self._add(
            'Api5xx',
            api.metric_server_error(period=period, statistic='Sum'),
            threshold=API_5XX_THRESHOLD,
            description='API Gateway answered 5XX (the API function failed or timed out).',
        )
        self._add(
            'ReflectionTimedOutOrAborted',
            cloudwatch.MathExpression(
                expression='timedOut + aborted',
                using_metrics={
                    'timedOut': state_machine.metric_timed_out(period=period, statistic='Sum'),
                    'aborted': state_machine.metric_aborted(period=period, statistic='Sum'),
                },
                period=period,
            ),
            threshold=1,
            description='A reflection workflow timed out or was aborted (its lease expires by itself; check the logs).',
        )

    def _add(self, construct_id: str, metric: cloudwatch.IMetric, *, threshold: float, description: str) -> None:
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            metric=metric,
            threshold=threshold,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        alarm.add_ok_action(actions.SnsAction(self.topic))
        self.alarms.append(alarm)

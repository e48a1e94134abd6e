"""ReflectionWorkflow: the Step Functions state machine, from THE ASL document the local stack also runs.

`functions/reflection/state_machine.asl.json` is used as is; only `${ReflectionFunctionArn}` is substituted (with the
reflection function's alias, so SnapStart applies).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constants import ASL_FUNCTION_PLACEHOLDER, LOG_RETENTION, STATE_MACHINE_ASL, STATE_MACHINE_START_ACTIONS
from infra.constructs.memory_key import MemoryKey
from infra.constructs.nag import acknowledge

# A reflection is at most a few model calls of 10 min each (with the ASL's retries); past this something is stuck.
WORKFLOW_TIMEOUT = Duration.hours(1)


class ReflectionWorkflow(Construct):
    """Standard workflow with its own role (invoke the reflection alias only), full logging and X-Ray tracing."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        reflection_function: lambda_.IFunction,
        state_machine_name: str,
        key: MemoryKey,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.state_machine_name = state_machine_name
        self.log_group = logs.LogGroup(
            self,
            'Logs',
            retention=logs.RetentionDays[LOG_RETENTION],
            encryption_key=key.key,
            removal_policy=removal_policy,
        )
        self.role = iam.Role(
            self,
            'Role',
            assumed_by=iam.ServicePrincipal('states.amazonaws.com'),
            description='Reflection workflow: invoke the reflection function alias',
        )
        self.role.add_to_policy(
            iam.PolicyStatement(actions=['lambda:InvokeFunction'], resources=[reflection_function.function_arn])
        )
        self.state_machine = sfn.StateMachine(
            self,
            'StateMachine',
            state_machine_name=state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            # Inline (not an S3 asset): the definition is visible in the template, `cdk diff` and the tests.
            definition_body=sfn.DefinitionBody.from_string(STATE_MACHINE_ASL.read_text(encoding='utf-8')),
            definition_substitutions={ASL_FUNCTION_PLACEHOLDER: reflection_function.function_arn},
            role=self.role,
            timeout=WORKFLOW_TIMEOUT,
            tracing_enabled=True,
            # Execution data holds job keys (user and thread ids): the state transitions are logged, not the data.
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
        )
        acknowledge(
            self.role,
            'IAM5',
            'Added by CDK for logging and tracing: CloudWatch Logs log-delivery and X-Ray actions '
            '(explicit actions) support no resource-level permissions, so their resource is `*`.',
            finding='Resource::*',
        )

    @staticmethod
    def arn_for(scope: Construct, state_machine_name: str) -> str:
        """The state machine's ARN from its name, without a reference to it.

        The reflection function starts executions too (OM_REFLECTION_STATE_MACHINE_ARN), and the state machine invokes
        that function: a `Ref` both ways would be a dependency cycle.
        """
        return Stack.of(scope).format_arn(
            service='states',
            resource='stateMachine',
            resource_name=state_machine_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def grant_start(self, grantee: iam.IGrantable) -> None:
        """`states:StartExecution` on this state machine (by name, see `arn_for`)."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(STATE_MACHINE_START_ACTIONS),
            resource_arns=[self.arn_for(self, self.state_machine_name)],
        )

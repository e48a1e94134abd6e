"""ServiceFunction: one of the service's Lambda functions, with its own least-privilege role, log group and alias.

Every function shares the defaults below (one runtime, one architecture, JSON logs, SnapStart, X-Ray active tracing).
SnapStart applies to published versions only, so callers (API Gateway, SQS, Step Functions, the schedule) invoke
`alias`, never the unqualified function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from aws_cdk import Annotations, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.constants import (
    LAMBDA_ALIAS,
    LAMBDA_ARCHITECTURE,
    LAMBDA_PYTHON_VERSION,
    LOG_RETENTION,
    LOG_WRITE_ACTIONS,
    FunctionSpec,
)
from infra.constructs.memory_key import MemoryKey
from infra.constructs.nag import acknowledge


class ServiceFunction(Construct):
    """A python Lambda function on the shared asset, invoked through its `live` alias."""

    RUNTIME: ClassVar[lambda_.Runtime] = lambda_.Runtime.PYTHON_3_12
    ARCHITECTURE: ClassVar[lambda_.Architecture] = lambda_.Architecture.X86_64
    LOGGING_FORMAT: ClassVar[lambda_.LoggingFormat] = lambda_.LoggingFormat.JSON
    SNAP_START: ClassVar[lambda_.SnapStartConf] = lambda_.SnapStartConf.ON_PUBLISHED_VERSIONS
    TRACING: ClassVar[lambda_.Tracing] = lambda_.Tracing.ACTIVE

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        spec: FunctionSpec,
        code: lambda_.Code,
        environment: Mapping[str, str],
        key: MemoryKey,
        removal_policy: RemovalPolicy,
        reserved_concurrency: int | None = None,
        snap_start: bool = True,
    ) -> None:
        super().__init__(scope, construct_id)
        # The asset's wheels are built for LAMBDA_PYTHON_VERSION/LAMBDA_ARCHITECTURE: the function must match them.
        assert self.RUNTIME.name == f'python{LAMBDA_PYTHON_VERSION}', self.RUNTIME.name
        assert self.ARCHITECTURE.name == LAMBDA_ARCHITECTURE, self.ARCHITECTURE.name
        self.spec = spec
        self.log_group = logs.LogGroup(
            self,
            'Logs',
            retention=logs.RetentionDays[LOG_RETENTION],
            encryption_key=key.key,
            removal_policy=removal_policy,
        )
        self.role = self._build_role()
        self.function = lambda_.Function(
            self,
            'Function',
            description=spec.description,
            runtime=self.RUNTIME,
            architecture=self.ARCHITECTURE,
            code=code,
            handler=spec.handler,
            memory_size=spec.memory_mb,
            timeout=Duration.seconds(spec.timeout_s),
            role=self.role,
            environment=dict(environment),
            logging_format=self.LOGGING_FORMAT,
            application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            log_group=self.log_group,
            snap_start=self.SNAP_START if snap_start else None,
            tracing=self.TRACING,
            reserved_concurrent_executions=reserved_concurrency,
        )
        acknowledge(
            self.role,
            'IAM5',
            'Active tracing: xray:PutTraceSegments and xray:PutTelemetryRecords support no resource-level permissions, '
            'so their resource is `*` (the only one in this role).',
            finding='Resource::*',
        )
        acknowledge(
            self.function,
            'L1',
            f"python{LAMBDA_PYTHON_VERSION} is the runtime the asset's wheels are built for (infra/constants.py); "
            'the runtime and the wheels move together, deliberately.',
        )
        self.alias = lambda_.Alias(self, 'Alias', alias_name=LAMBDA_ALIAS, version=self.function.current_version)
        if snap_start:
            Annotations.of(self.function).acknowledge_warning(
                '@aws-cdk/aws-lambda:snapStartRequirePublish', 'Every deployment publishes a version behind the alias.'
            )

    def _build_role(self) -> iam.Role:
        # No AWSLambdaBasicExecutionRole: it may write to every log group. This role writes to its own only.
        role = iam.Role(
            self,
            'Role',
            assumed_by=iam.ServicePrincipal('lambda.amazonaws.com'),
            description=f'{self.spec.service}: least-privilege execution role',
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=list(LOG_WRITE_ACTIONS),
                # The log group's ARN ends in `:*`, which covers its streams and nothing else.
                resources=[self.log_group.log_group_arn],
            )
        )
        return role

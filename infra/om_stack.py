"""OmStack: composes the service's constructs (STYLE §12). Settings come in as `StackSettings` (see infra/app.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import Annotations, CfnOutput, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from constructs import Construct
from pydantic import ValidationError

from infra.asset_builder import build_lambda_asset
from infra.constants import (
    ALL_FUNCTIONS,
    API_BURST_LIMIT,
    API_FUNCTION,
    API_RATE_LIMIT,
    ASSET_TIKTOKEN_DIR,
    BUFFER_WORKER_FUNCTION,
    DEFAULT_STAGE,
    LAMBDA_TASK_ROOT,
    METRICS_NAMESPACE,
    OUTPUT_ALARM_TOPIC_ARN,
    OUTPUT_API_ID,
    OUTPUT_API_URL,
    OUTPUT_AUTH_MODE,
    OUTPUT_BUCKET_NAME,
    OUTPUT_DEAD_LETTER_QUEUE_URL,
    OUTPUT_GEMINI_SECRET_ARN,
    OUTPUT_OPENAI_SECRET_ARN,
    OUTPUT_STATE_MACHINE_ARN,
    OUTPUT_TABLE_NAME,
    OUTPUT_WORK_QUEUE_URL,
    QUEUE_BATCH_SIZE,
    QUEUE_MAX_CONCURRENCY,
    REFLECTION_FUNCTION,
    REQUEST_TIME_BUDGET_S,
    SWEEPER_FUNCTION,
    FunctionSpec,
)
from infra.constructs import (
    ApiAuth,
    GeminiSecret,
    MemoryApi,
    MemoryBucket,
    MemoryTable,
    OperationalAlarms,
    ReflectionWorkflow,
    ServiceFunction,
    SweeperSchedule,
    WorkQueue,
)
from infra.constructs.nag import acknowledge, nag_text
from infra.model_access import (
    BEDROCK_INVOKE_ACTIONS,
    INFERENCE_PROFILE_CONDITION,
    Arns,
    ModelAccess,
    function_access,
)
from om_lib.config import OMConfig, format_validation_error
from om_lib.embedders import DEFAULT_EMBEDDING_MODEL
from om_lib.errors import ConfigError

# Lambda allows 4 KB of environment variables in total; the other variables take about 1 KB once resolved.
MAX_OM_CONFIG_BYTES = 3000


def validate_om_config(
    document: OMConfig | Mapping[str, Any] | bool | str | None, source: str = 'omConfig'
) -> OMConfig:
    """The OM configuration, validated as the functions will validate it at start-up.

    Raises:
        ConfigError: Not JSON, or not a valid document; the message names each field and its rule.
    """
    if isinstance(document, OMConfig):
        config = document
    else:
        if isinstance(document, str):
            try:
                document = json.loads(document)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f'{source}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})'
                ) from exc
        try:
            config = OMConfig.model_validate(True if document is None else document)
        except ValidationError as exc:
            raise ConfigError(f'{source}: invalid configuration\n{format_validation_error(exc)}') from exc
    size = len(config_json(config).encode())
    if size > MAX_OM_CONFIG_BYTES:
        raise ConfigError(
            f'{source}: {size} bytes once serialised; the functions receive it in OM_CONFIG and Lambda allows 4 KB of '
            f'environment in total (at most {MAX_OM_CONFIG_BYTES} bytes here): shorten the instructions'
        )
    return config


def config_json(config: OMConfig) -> str:
    """OM_CONFIG: the document as set (camelCase, defaults left out), compact."""
    return json.dumps(config.to_json_dict(), separators=(',', ':'), sort_keys=True)


@dataclass(frozen=True)
class StackSettings:
    """Everything a deployment chooses. `om_config` is validated when the stack is built (so at synth)."""

    om_config: OMConfig | Mapping[str, Any] | bool | str | None = None
    auth: ApiAuth = field(default_factory=ApiAuth)
    stage: str = DEFAULT_STAGE
    gemini_secret_arn: str | None = None
    gemini_secret_name: str | None = None
    openai_secret_arn: str | None = None
    openai_secret_name: str | None = None
    openai_base_url: str | None = None
    embedding_model: str | None = None
    embedding_dimensions: int | None = None
    asset_mode: str = 'full'
    api_rate_limit: float = API_RATE_LIMIT
    api_burst_limit: int = API_BURST_LIMIT
    alarm_email: str | None = None


class OmStack(Stack):
    """The whole service: table, bucket, queues, secret, four functions, workflow, API, schedule, alarms."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: StackSettings, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.om_config = validate_om_config(settings.om_config)
        self.asset = build_lambda_asset(settings.asset_mode)
        code = lambda_.Code.from_asset(str(self.asset.path))

        self.table = MemoryTable(self, 'MemoryTable')
        self.bucket = MemoryBucket(self, 'MemoryBucket')
        self.work_queue = WorkQueue(
            self, 'WorkQueue', consumer_timeout=Duration.seconds(BUFFER_WORKER_FUNCTION.timeout_s)
        )
        # Model access per function, from the configuration: Bedrock grants, and an API-key secret only for a provider
        # that some function calls (an all-Bedrock deployment has no secret at all).
        self.model_access = function_access(
            self.om_config.resolved(),
            Arns(partition=self.partition, region=self.region, account=self.account),
            embedding_model=settings.embedding_model or DEFAULT_EMBEDDING_MODEL,
        )
        keys = frozenset().union(*(access.secrets for access in self.model_access.values()))
        self.gemini_secret = (
            GeminiSecret(
                self, 'GeminiSecret', secret_arn=settings.gemini_secret_arn, secret_name=settings.gemini_secret_name
            )
            if 'google' in keys
            else None
        )
        self.openai_secret = (
            GeminiSecret(
                self,
                'OpenAISecret',
                secret_arn=settings.openai_secret_arn,
                secret_name=settings.openai_secret_name,
                provider='OpenAI',
            )
            if 'openai' in keys
            else None
        )
        state_machine_name = f'{self.stack_name}-reflection'
        environment = self._environment(ReflectionWorkflow.arn_for(self, state_machine_name))

        self.functions: dict[str, ServiceFunction] = {}
        for spec in ALL_FUNCTIONS:
            self.functions[spec.construct_id] = self._build_function(spec, code, environment)

        self.workflow = ReflectionWorkflow(
            self,
            'ReflectionWorkflow',
            reflection_function=self.functions[REFLECTION_FUNCTION.construct_id].alias,
            state_machine_name=state_machine_name,
        )
        for function in self.functions.values():
            self.workflow.grant_start(function.role)

        buffer_worker = self.functions[BUFFER_WORKER_FUNCTION.construct_id]
        buffer_worker.alias.add_event_source(
            event_sources.SqsEventSource(
                self.work_queue.queue,
                batch_size=QUEUE_BATCH_SIZE,
                max_concurrency=QUEUE_MAX_CONCURRENCY,
                report_batch_item_failures=True,
            )
        )
        self.api = MemoryApi(
            self,
            'MemoryApi',
            handler=self.functions[API_FUNCTION.construct_id].alias,
            auth=settings.auth,
            stage_name=settings.stage,
            rate_limit=settings.api_rate_limit,
            burst_limit=settings.api_burst_limit,
        )
        self.schedule = SweeperSchedule(
            self, 'SweeperSchedule', sweeper=self.functions[SWEEPER_FUNCTION.construct_id].alias
        )
        self.alarms = OperationalAlarms(
            self,
            'Alarms',
            dead_letter_queue=self.work_queue.dead_letter_queue,
            functions=[(spec_id.removesuffix('Function'), f.function) for spec_id, f in self.functions.items()],
            api=self.api.api,
            state_machine=self.workflow.state_machine,
            email=settings.alarm_email,
        )
        if settings.auth.mode == 'none':
            Annotations.of(self).add_warning_v2(
                'om:auth-none', 'authMode=none: the API is open to anyone who knows its URL (explicitly requested).'
            )
        self._build_outputs()

    def _environment(self, state_machine_arn: str) -> dict[str, str]:
        models: dict[str, str] = {}
        # The keys' locations, never the keys: functions read them from Secrets Manager on first use.
        if self.gemini_secret is not None:
            models['OM_GEMINI_SECRET_ARN'] = self.gemini_secret.secret_arn
        if self.openai_secret is not None:
            models['OM_OPENAI_SECRET_ARN'] = self.openai_secret.secret_arn
        if self.settings.openai_base_url:
            models['OPENAI_BASE_URL'] = self.settings.openai_base_url
        if self.settings.embedding_model:
            models['OM_EMBEDDING_MODEL'] = self.settings.embedding_model
        if self.settings.embedding_dimensions:
            models['OM_EMBEDDING_DIMENSIONS'] = str(self.settings.embedding_dimensions)
        return {
            'OM_TABLE_NAME': self.table.table.table_name,
            'OM_BUCKET_NAME': self.bucket.bucket.bucket_name,
            'OM_WORK_QUEUE_URL': self.work_queue.queue.queue_url,
            'OM_REFLECTION_STATE_MACHINE_ARN': state_machine_arn,
            **models,
            'OM_REQUEST_TIME_BUDGET_S': str(REQUEST_TIME_BUDGET_S),
            'OM_AUTH_MODE': self.settings.auth.mode,
            'OM_AUTH_CLAIM': self.settings.auth.claim,
            'OM_CONFIG': config_json(self.om_config),
            'TIKTOKEN_CACHE_DIR': f'{LAMBDA_TASK_ROOT}/{ASSET_TIKTOKEN_DIR}',
            'POWERTOOLS_METRICS_NAMESPACE': METRICS_NAMESPACE,
        }

    def _build_function(self, spec: FunctionSpec, code: lambda_.Code, environment: dict[str, str]) -> ServiceFunction:
        function = ServiceFunction(
            self,
            spec.construct_id,
            spec=spec,
            code=code,
            environment={**environment, 'POWERTOOLS_SERVICE_NAME': spec.service},
        )
        self.table.grant_data_access(function.role)
        self.bucket.grant_data_access(function.role)
        self.work_queue.grant_submit(function.role)
        self._grant_models(function, self.model_access[spec.construct_id])
        return function

    def _grant_models(self, function: ServiceFunction, access: ModelAccess) -> None:
        """Exactly the model access this function's roles need (infra/model_access.py)."""
        if access.bedrock:
            function.role.add_to_policy(
                iam.PolicyStatement(actions=list(BEDROCK_INVOKE_ACTIONS), resources=list(access.bedrock))
            )
        for profile, models in access.bedrock_via_profile.items():
            function.role.add_to_policy(
                iam.PolicyStatement(
                    actions=list(BEDROCK_INVOKE_ACTIONS),
                    resources=list(models),
                    conditions={'StringEquals': {INFERENCE_PROFILE_CONDITION: profile}},
                )
            )
            for model in models:
                acknowledge(
                    function.role,
                    'IAM5',
                    'An inference profile routes to its foundation model in regions that change over time; the '
                    f'region wildcard is fenced by {INFERENCE_PROFILE_CONDITION} = this one profile.',
                    finding=f'Resource::{nag_text(self, model)}',
                )
        if 'google' in access.secrets and self.gemini_secret is not None:
            self.gemini_secret.grant_read(function.role)
        if 'openai' in access.secrets and self.openai_secret is not None:
            self.openai_secret.grant_read(function.role)

    def _build_outputs(self) -> None:
        outputs = {
            OUTPUT_API_URL: (self.api.api.url, 'Base URL of the HTTP API (stage included)'),
            OUTPUT_API_ID: (self.api.api.rest_api_id, 'REST API id'),
            OUTPUT_AUTH_MODE: (self.settings.auth.mode, 'How the API authenticates callers'),
            OUTPUT_TABLE_NAME: (self.table.table.table_name, 'DynamoDB memory table'),
            OUTPUT_BUCKET_NAME: (self.bucket.bucket.bucket_name, 'S3 bucket for offloaded values and attachments'),
            OUTPUT_WORK_QUEUE_URL: (self.work_queue.queue.queue_url, 'SQS FIFO work queue'),
            OUTPUT_DEAD_LETTER_QUEUE_URL: (self.work_queue.dead_letter_queue.queue_url, 'Dead-letter queue'),
            OUTPUT_STATE_MACHINE_ARN: (self.workflow.state_machine.state_machine_arn, 'Reflection workflow'),
            OUTPUT_ALARM_TOPIC_ARN: (self.alarms.topic.topic_arn, 'SNS topic of the alarms'),
        }
        if self.gemini_secret is not None:
            outputs[OUTPUT_GEMINI_SECRET_ARN] = (self.gemini_secret.secret_arn, 'Secret holding the Gemini API key')
        if self.openai_secret is not None:
            outputs[OUTPUT_OPENAI_SECRET_ARN] = (self.openai_secret.secret_arn, 'Secret holding the OpenAI API key')
        for logical_id, (value, description) in outputs.items():
            CfnOutput(self, logical_id, value=value, description=description).override_logical_id(logical_id)

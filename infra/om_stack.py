"""OmStack: composes the service's constructs (STYLE §12). Settings come in as `StackSettings` (see infra/app.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import Annotations, CfnOutput, DefaultStackSynthesizer, Duration, Fn, RemovalPolicy, Stack
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
    CHAT_STREAM_FUNCTION,
    CHAT_STREAM_WRAPPER,
    DEFAULT_STAGE,
    LAMBDA_TASK_ROOT,
    METRICS_NAMESPACE,
    ORPHAN_UPLOADS_FUNCTION,
    OUTPUT_ALARM_TOPIC_ARN,
    OUTPUT_API_ID,
    OUTPUT_API_URL,
    OUTPUT_AUTH_MODE,
    OUTPUT_BUCKET_NAME,
    OUTPUT_DASHBOARD_NAME,
    OUTPUT_DEAD_LETTER_QUEUE_URL,
    OUTPUT_EVENT_BUS_ARN,
    OUTPUT_EVENT_BUS_NAME,
    OUTPUT_EVENTS_QUEUE_URL,
    OUTPUT_GEMINI_SECRET_ARN,
    OUTPUT_KEY_ARN,
    OUTPUT_OPENAI_SECRET_ARN,
    OUTPUT_STATE_MACHINE_ARN,
    OUTPUT_TABLE_NAME,
    OUTPUT_USAGE_PLAN_ID,
    OUTPUT_WEB_ACL_ARN,
    OUTPUT_WORK_QUEUE_URL,
    QUEUE_BATCH_SIZE,
    QUEUE_MAX_CONCURRENCY,
    REFLECTION_FUNCTION,
    REQUEST_TIME_BUDGET_S,
    SWEEP_EVERY_MINUTES,
    SWEEPER_FUNCTION,
    WAF_RATE_LIMIT_PER_5_MIN,
    FunctionSpec,
)
from infra.constructs import (
    ApiAuth,
    LifecycleEvents,
    MemoryApi,
    MemoryBucket,
    MemoryKey,
    MemoryTable,
    ModelAccess,
    OperationalAlarms,
    OperationsDashboard,
    OrphanUploadCleanup,
    ReflectionWorkflow,
    ServiceFunction,
    SweeperSchedule,
    WatchedFunction,
    WorkQueue,
)
from om_lib.config import OMConfig, format_validation_error
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
    # OPENAI_BASE_URL of the functions that call an openai/ model: an OpenAI-compatible gateway.
    openai_base_url: str | None = None
    # OM_EMBEDDING_MODEL / OM_EMBEDDING_DIMENSIONS of the functions (unset: the functions' defaults).
    embedding_model: str | None = None
    embedding_dimensions: int | None = None
    asset_mode: str = 'full'
    api_rate_limit: float = API_RATE_LIMIT
    api_burst_limit: int = API_BURST_LIMIT
    alarm_email: str | None = None
    # `retain` keeps the key, table, bucket and logs when the stack is deleted; `destroy` is for throwaway stacks.
    removal_policy: str = 'retain'
    waf_rate_limit: int = WAF_RATE_LIMIT_PER_5_MIN
    waf_block_body_rules: bool = False
    api_keys: tuple[str, ...] = ()
    reserved_concurrency: bool = True
    # The role CloudFormation deploys with (it creates the table and the secret with the key); default: the CDK
    # bootstrap's execution role.
    deploy_role_arn: str | None = None
    operator_role_arns: tuple[str, ...] = ()
    # Serve the memory inspector page at GET /inspector (behind the API's authentication). Off unless asked for.
    inspector: bool = False
    # Web origins whose pages may write to the API (OM_ALLOWED_ORIGINS), answered with CORS (preflights at the gateway).
    allowed_origins: tuple[str, ...] = ()
    # A queue behind a rule on the lifecycle event bus, for a consumer of the team's (the bus is always there).
    lifecycle_events_queue: bool = False


class OmStack(Stack):
    """The whole service: key, table, bucket, queues, model-key secrets, five functions, workflow, API + WAF, schedule,
    the orphan-upload cleanup, the lifecycle event bus, alarms, dashboard."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: StackSettings, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.om_config = validate_om_config(settings.om_config)
        self.asset = build_lambda_asset(settings.asset_mode)
        code = lambda_.Code.from_asset(str(self.asset.path))
        removal = RemovalPolicy.DESTROY if settings.removal_policy == 'destroy' else RemovalPolicy.RETAIN
        self.removal_policy = removal

        self.key = MemoryKey(
            self,
            'MemoryKey',
            removal_policy=removal,
            deploy_role_arn=settings.deploy_role_arn or self._bootstrap_deploy_role_arn(),
            operator_role_arns=settings.operator_role_arns,
        )
        self.table = MemoryTable(self, 'MemoryTable', key=self.key, removal_policy=removal)
        self.bucket = MemoryBucket(self, 'MemoryBucket', key=self.key, removal_policy=removal)
        self.work_queue = WorkQueue(
            self, 'WorkQueue', consumer_timeout=Duration.seconds(BUFFER_WORKER_FUNCTION.timeout_s), key=self.key
        )
        self.models = ModelAccess(
            self,
            'ModelAccess',
            config=self.om_config,
            key=self.key,
            embedding_model=settings.embedding_model,
            openai_base_url=settings.openai_base_url,
            gemini_secret_arn=settings.gemini_secret_arn,
            gemini_secret_name=settings.gemini_secret_name,
            openai_secret_arn=settings.openai_secret_arn,
            openai_secret_name=settings.openai_secret_name,
        )
        state_machine_name = f'{self.stack_name}-reflection'
        self.state_machine_arn = ReflectionWorkflow.arn_for(self, state_machine_name)
        self.lifecycle_events = LifecycleEvents(
            self, 'LifecycleEvents', key=self.key, queue=settings.lifecycle_events_queue
        )

        self.functions: dict[str, ServiceFunction] = {}
        for spec in ALL_FUNCTIONS:
            self.functions[spec.construct_id] = self._build_function(spec, code)

        self.workflow = ReflectionWorkflow(
            self,
            'ReflectionWorkflow',
            reflection_function=self.functions[REFLECTION_FUNCTION.construct_id].alias,
            state_machine_name=state_machine_name,
            key=self.key,
            removal_policy=removal,
        )
        for function in self.functions.values():
            if function.spec.access.starts_reflections:
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
        orphan_uploads = self.functions[ORPHAN_UPLOADS_FUNCTION.construct_id]
        self.orphan_uploads = OrphanUploadCleanup(
            self,
            'OrphanUploadCleanup',
            bucket=self.bucket,
            function=orphan_uploads.alias,
            role=orphan_uploads.role,
            consumer_timeout=Duration.seconds(ORPHAN_UPLOADS_FUNCTION.timeout_s),
            key=self.key,
        )
        self.api = MemoryApi(
            self,
            'MemoryApi',
            handler=self.functions[API_FUNCTION.construct_id].alias,
            stream_handler=self.functions[CHAT_STREAM_FUNCTION.construct_id].alias,
            stream_timeout=Duration.seconds(CHAT_STREAM_FUNCTION.timeout_s),
            auth=settings.auth,
            stage_name=settings.stage,
            rate_limit=settings.api_rate_limit,
            burst_limit=settings.api_burst_limit,
            key=self.key,
            removal_policy=removal,
            waf_rate_limit=settings.waf_rate_limit,
            waf_block_body_rules=settings.waf_block_body_rules,
            api_keys=settings.api_keys,
            allowed_origins=settings.allowed_origins,
        )
        self.schedule = SweeperSchedule(
            self, 'SweeperSchedule', sweeper=self.functions[SWEEPER_FUNCTION.construct_id].alias
        )
        watched = [
            WatchedFunction(
                name=spec_id.removesuffix('Function'),
                function=f.function,
                service=f.spec.service,
                # Who emits which failure metric: observation and reflection cycles run in the API and the buffer
                # worker; the workflow's failures are counted by the reflection function.
                reports_observations='observer' in f.spec.access.model_roles,
                reports_reflections='reflector' in f.spec.access.model_roles,
            )
            for spec_id, f in self.functions.items()
        ]
        self.alarms = OperationalAlarms(
            self,
            'Alarms',
            key=self.key,
            dead_letter_queues=self.work_queue.dead_letter_queues,
            upload_dead_letter_queues=self.orphan_uploads.dead_letter_queues,
            event_dead_letter_queues=self.lifecycle_events.dead_letter_queues,
            functions=watched,
            api=self.api.api,
            state_machine=self.workflow.state_machine,
            email=settings.alarm_email,
        )
        self.dashboard = OperationsDashboard(
            self,
            'Dashboard',
            api=self.api.api,
            functions=watched,
            queue=self.work_queue.queue,
            dead_letter_queues=[*self.work_queue.dead_letter_queues, *self.orphan_uploads.dead_letter_queues],
            state_machine=self.workflow.state_machine,
        )
        if settings.auth.mode == 'none':
            Annotations.of(self).add_warning_v2(
                'om:auth-none', 'authMode=none: the API is open to anyone who knows its URL (explicitly requested).'
            )
        if removal == RemovalPolicy.DESTROY:
            Annotations.of(self).add_warning_v2(
                'om:removal-destroy',
                'removalPolicy=destroy: deleting the stack deletes the table, the bucket, the logs and schedules the '
                "key's deletion (a throwaway stack; never for users' data).",
            )
        self._build_outputs()

    def _bootstrap_deploy_role_arn(self) -> str:
        synthesizer = self.synthesizer
        if not isinstance(synthesizer, DefaultStackSynthesizer):
            raise ValueError(
                'the key policy names the role CloudFormation deploys with: pass -c deployRoleArn=<role ARN> '
                '(this stack does not use the default CDK bootstrap roles)'
            )
        # `arn:${AWS::Partition}:iam::${AWS::AccountId}:role/cdk-<qualifier>-cfn-exec-role-...`
        return Fn.sub(synthesizer.cloud_formation_execution_role_arn)

    def _environment(self, spec: FunctionSpec) -> dict[str, str]:
        # Model keys' secrets and OPENAI_BASE_URL are added by ModelAccess.grant, to the functions that call them.
        embedding: dict[str, str] = {}
        if self.settings.embedding_model:
            embedding['OM_EMBEDDING_MODEL'] = self.settings.embedding_model
        if self.settings.embedding_dimensions:
            embedding['OM_EMBEDDING_DIMENSIONS'] = str(self.settings.embedding_dimensions)
        # Only the API serves the inspector page, and only when the deployment asks for it.
        inspector = {'OM_INSPECTOR': 'true'} if self.settings.inspector and spec is API_FUNCTION else {}
        # Both functions behind the API answer browsers (the chat stream goes through the same edge checks).
        origins = (
            {'OM_ALLOWED_ORIGINS': ','.join(self.settings.allowed_origins)}
            if self.settings.allowed_origins and spec in (API_FUNCTION, CHAT_STREAM_FUNCTION)
            else {}
        )
        # The chat stream runs the API handler in its own streaming runtime (functions/api/stream_runtime.py).
        runtime = {'AWS_LAMBDA_EXEC_WRAPPER': CHAT_STREAM_WRAPPER} if spec is CHAT_STREAM_FUNCTION else {}
        return {
            **embedding,
            **inspector,
            **origins,
            **runtime,
            'OM_TABLE_NAME': self.table.table.table_name,
            'OM_BUCKET_NAME': self.bucket.bucket.bucket_name,
            'OM_BUCKET_KMS_KEY_ARN': self.key.key_arn,
            'OM_WORK_QUEUE_URL': self.work_queue.queue.queue_url,
            'OM_REFLECTION_STATE_MACHINE_ARN': self.state_machine_arn,
            **({'OM_EVENT_BUS_NAME': self.lifecycle_events.bus_name} if spec.access.publishes_events else {}),
            'OM_REQUEST_TIME_BUDGET_S': str(REQUEST_TIME_BUDGET_S),
            'OM_SWEEP_INTERVAL_S': str(SWEEP_EVERY_MINUTES * 60),
            'OM_AUTH_MODE': self.settings.auth.mode,
            'OM_AUTH_CLAIM': self.settings.auth.claim,
            'OM_CONFIG': config_json(self.om_config),
            'TIKTOKEN_CACHE_DIR': f'{LAMBDA_TASK_ROOT}/{ASSET_TIKTOKEN_DIR}',
            'POWERTOOLS_METRICS_NAMESPACE': METRICS_NAMESPACE,
            'POWERTOOLS_SERVICE_NAME': spec.service,
        }

    def _build_function(self, spec: FunctionSpec, code: lambda_.Code) -> ServiceFunction:
        """The function, with exactly the grants its `FunctionAccess` lists."""
        function = ServiceFunction(
            self,
            spec.construct_id,
            spec=spec,
            code=code,
            environment=self._environment(spec),
            key=self.key,
            removal_policy=self.removal_policy,
            reserved_concurrency=spec.reserved_concurrency if self.settings.reserved_concurrency else None,
            # A snapshot of a runtime of our own is not what SnapStart restores (it snapshots the managed runtime's
            # init); the stream function starts cold.
            snap_start=spec is not CHAT_STREAM_FUNCTION,
        )
        access, sid = spec.access, spec.construct_id
        self.table.grant(function.role, access, sid=sid)
        self.bucket.grant(function.role, access, sid=sid)
        if access.sends_jobs:
            self.work_queue.grant_submit(function.role, sid=sid)
        if access.consumes_jobs:
            self.work_queue.grant_consume(function.role, sid=sid)
        if access.publishes_events:
            self.lifecycle_events.grant_publish(function.role)
        self.models.grant(function, access.model_roles, access.streamed_roles)
        return function

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
            OUTPUT_ALARM_TOPIC_ARN: (self.alarms.topic.topic_arn, 'SNS topic of the alarms (encrypted)'),
            OUTPUT_KEY_ARN: (self.key.key_arn, "The KMS key encrypting the stack's data and logs"),
            OUTPUT_WEB_ACL_ARN: (self.api.firewall.web_acl.attr_arn, 'WAF web ACL in front of the API stage'),
            OUTPUT_DASHBOARD_NAME: (self.dashboard.dashboard.dashboard_name, 'CloudWatch dashboard'),
            OUTPUT_EVENT_BUS_NAME: (self.lifecycle_events.bus_name, 'EventBridge bus of the lifecycle events'),
            OUTPUT_EVENT_BUS_ARN: (self.lifecycle_events.bus.event_bus_arn, 'ARN of the lifecycle event bus'),
        }
        if self.lifecycle_events.queue is not None:
            outputs[OUTPUT_EVENTS_QUEUE_URL] = (
                self.lifecycle_events.queue.queue_url,
                'Queue receiving every lifecycle event (lifecycleEventsQueue)',
            )
        for output, secret in (
            (OUTPUT_GEMINI_SECRET_ARN, self.models.gemini_secret),
            (OUTPUT_OPENAI_SECRET_ARN, self.models.openai_secret),
        ):
            if secret is not None:
                outputs[output] = (secret.secret_arn, f'Secret holding the {secret.provider} API key')
        if self.api.usage_plan is not None:
            outputs[OUTPUT_USAGE_PLAN_ID] = (self.api.usage_plan.usage_plan_id, 'Usage plan of the API keys')
        for logical_id, (value, description) in outputs.items():
            CfnOutput(self, logical_id, value=value, description=description).override_logical_id(logical_id)

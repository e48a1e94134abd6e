"""Names, sizes and limits of the deployed stack, in one place (STYLE §12).

Plain values only: the constructs turn them into CDK objects. The Lambda runtime and architecture here are the ones
the asset builder installs wheels for, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
STATE_MACHINE_ASL: Final = REPO_ROOT / 'functions' / 'reflection' / 'state_machine.asl.json'
# The placeholder in the ASL document that the CDK app (and the local stack) replace with the reflection function.
ASL_FUNCTION_PLACEHOLDER: Final = 'ReflectionFunctionArn'

# ---- Lambda: one runtime, one architecture, for every function and for the wheels in the asset -------------------
LAMBDA_PYTHON_VERSION: Final = '3.12'
LAMBDA_ARCHITECTURE: Final = 'x86_64'
# tiktoken 0.14 ships only manylinux_2_28 wheels (glibc 2.28+: the python3.12 runtime's Amazon Linux 2023 has 2.34).
LAMBDA_WHEEL_PLATFORMS: Final = ('manylinux_2_28_x86_64', 'manylinux2014_x86_64')
LAMBDA_ALIAS: Final = 'live'
LOG_RETENTION: Final = 'ONE_MONTH'  # aws_logs.RetentionDays member
# The seeded tiktoken cache inside the asset; Lambda unpacks the asset into /var/task (read-only, which is fine).
ASSET_TIKTOKEN_DIR: Final = 'tiktoken_cache'
LAMBDA_TASK_ROOT: Final = '/var/task'

ASSET_MODES: Final = ('full', 'source')
"""`full`: wheels + source + encoding (what you deploy). `source`: source + encoding only (tests, quick synths)."""

# ---- IAM: explicit actions only (no `*`, no `service:*`, no `service:Prefix*`) ---------------------------------------
# What the store (om_lib/adapters/aws/dynamodb/store.py) and the blob reader call; add an action here when they do more.
TABLE_READ_ACTIONS: Final = ('dynamodb:GetItem', 'dynamodb:BatchGetItem', 'dynamodb:Query')
TABLE_WRITE_ACTIONS: Final = ('dynamodb:PutItem', 'dynamodb:UpdateItem', 'dynamodb:BatchWriteItem')
TABLE_DELETE_ACTIONS: Final = ('dynamodb:DeleteItem',)
OBJECT_READ_ACTIONS: Final = ('s3:GetObject',)
OBJECT_WRITE_ACTIONS: Final = ('s3:PutObject', 's3:DeleteObject')
BUCKET_ACTIONS: Final = ('s3:ListBucket',)
QUEUE_SEND_ACTIONS: Final = ('sqs:SendMessage',)
# Publishing lifecycle events onto the stack's bus.
EVENT_PUBLISH_ACTIONS: Final = ('events:PutEvents',)
STATE_MACHINE_START_ACTIONS: Final = ('states:StartExecution',)
SECRET_READ_ACTIONS: Final = ('secretsmanager:GetSecretValue',)
LOG_WRITE_ACTIONS: Final = ('logs:CreateLogStream', 'logs:PutLogEvents')
# X-Ray's write actions support no resource-level permission: the one place a function's role has resource `*`.
# (Metrics are EMF log lines, so no role is granted cloudwatch:PutMetricData at all.)
XRAY_ACTIONS: Final = ('xray:PutTraceSegments', 'xray:PutTelemetryRecords')

# ---- KMS: one customer-managed key for everything the stack stores --------------------------------------------------
# Administration only (no use of the key): the account's IAM policies decide who administers it.
KMS_ADMIN_ACTIONS: Final = (
    'kms:CancelKeyDeletion',
    'kms:CreateAlias',
    'kms:DeleteAlias',
    'kms:DescribeKey',
    'kms:DisableKey',
    'kms:EnableKey',
    'kms:EnableKeyRotation',
    'kms:GetKeyPolicy',
    'kms:GetKeyRotationStatus',
    'kms:ListGrants',
    'kms:ListKeyPolicies',
    'kms:ListResourceTags',
    'kms:PutKeyPolicy',
    'kms:RevokeGrant',
    'kms:ScheduleKeyDeletion',
    'kms:TagResource',
    'kms:UntagResource',
    'kms:UpdateAlias',
    'kms:UpdateKeyDescription',
)
KMS_DECRYPT_ACTIONS: Final = ('kms:Decrypt',)
KMS_ENCRYPT_DECRYPT_ACTIONS: Final = ('kms:Decrypt', 'kms:Encrypt', 'kms:GenerateDataKey')
# DynamoDB keeps a table key under the KMS key; a table's users need to be allowed to use it through DynamoDB, its
# creator to give DynamoDB a grant.
KMS_TABLE_USER_ACTIONS: Final = ('kms:Decrypt', 'kms:DescribeKey', 'kms:Encrypt', 'kms:GenerateDataKey')
KMS_TABLE_CREATOR_ACTIONS: Final = (*KMS_TABLE_USER_ACTIONS, 'kms:CreateGrant')
# CloudWatch Logs encrypts log groups with the key (AWS documents these actions for it).
KMS_LOGS_ACTIONS: Final = (
    'kms:Decrypt',
    'kms:DescribeKey',
    'kms:Encrypt',
    'kms:GenerateDataKey',
    'kms:GenerateDataKeyWithoutPlaintext',
    'kms:ReEncryptFrom',
    'kms:ReEncryptTo',
)
# CloudWatch alarms publishing to the encrypted topic.
KMS_ALARM_PUBLISHER_ACTIONS: Final = ('kms:Decrypt', 'kms:GenerateDataKey')
KMS_PENDING_WINDOW_DAYS: Final = 30

REMOVAL_POLICIES: Final = ('retain', 'destroy')
"""`retain` (default): the key, table, bucket and logs outlive the stack. `destroy`: a throwaway stack, all removed."""


@dataclass(frozen=True)
class FunctionAccess:
    """What one function may do, and nothing more (its role is built from this; tests/infra check the calls it makes).

    Attributes:
        table_actions: DynamoDB actions on the table and `indexes`.
        indexes: The table's indexes this function queries.
        object_actions: S3 actions on the bucket's objects.
        object_keys: The objects those actions apply to: a key pattern (`*`: every object).
        lists_bucket: `s3:ListBucket` (prefix deletes when erasing).
        sends_jobs: `sqs:SendMessage` to the work queue.
        consumes_jobs: The work queue is this function's event source.
        consumes_upload_events: The queue of the bucket's upload events is this function's event source.
        starts_reflections: `states:StartExecution` on the reflection workflow.
        publishes_events: `events:PutEvents` on the lifecycle event bus (it makes memory outcomes).
        model_roles: Which configured models it calls (`observer`, `reflector`, `actor`, `title`, `embedder`): the
            providers of those models decide its model grants (infra/constructs/model_access.py: the Gemini or OpenAI
            key's secret, `bedrock:InvokeModel` on the configured Bedrock models).
        streamed_roles: Of those, the roles whose answers it streams (the chat stream's Actor): a Bedrock model also
            needs `bedrock:InvokeModelWithResponseStream` for ConverseStream.
    """

    table_actions: tuple[str, ...]
    indexes: tuple[str, ...]
    object_actions: tuple[str, ...] = ()
    object_keys: str = '*'
    lists_bucket: bool = False
    sends_jobs: bool = False
    consumes_jobs: bool = False
    consumes_upload_events: bool = False
    starts_reflections: bool = False
    publishes_events: bool = False
    model_roles: tuple[str, ...] = ()
    streamed_roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda function of the service."""

    construct_id: str
    handler: str
    memory_mb: int
    timeout_s: int
    description: str
    service: str
    access: FunctionAccess
    # Reserved concurrency (None: none). A reservation caps the function, so a backlog cannot take the account's
    # concurrency from the API; `-c reservedConcurrency=false` drops them (accounts with a small concurrency quota).
    reserved_concurrency: int | None = None


# The indexes (om_lib/adapters/aws/dynamodb/schema.py): LSI1 messages by seq, GSI1 threads of a resource, GSI2 the
# attention list (the sweeper's), GSI3 a resource's threads with unobserved messages.
_DATA_INDEXES = ('LSI1', 'GSI1', 'GSI3')
_ALL_TABLE_ACTIONS = (*TABLE_READ_ACTIONS, *TABLE_WRITE_ACTIONS, *TABLE_DELETE_ACTIONS)

API_FUNCTION: Final = FunctionSpec(
    'ApiFunction',
    'functions.api.handler.lambda_handler',
    1024,
    29,
    'HTTP API (API Gateway REST proxy)',
    'om-api',
    FunctionAccess(
        table_actions=_ALL_TABLE_ACTIONS,
        indexes=_DATA_INDEXES,
        # PutObject also signs the presigned attachment uploads (the uploader acts with this role's permission).
        object_actions=(*OBJECT_READ_ACTIONS, *OBJECT_WRITE_ACTIONS),
        lists_bucket=True,
        sends_jobs=True,
        starts_reflections=True,
        publishes_events=True,
        model_roles=('observer', 'reflector', 'actor', 'title', 'embedder'),
    ),
)
# The chat stream (`POST /threads/{threadId}/chat` and `/chat/stream` behind API Gateway's response streaming): the
# API's handler in a runtime that streams (functions/api/stream_runtime.py, started by AWS_LAMBDA_EXEC_WRAPPER). Its
# timeout bounds a streamed turn: the memory work's budget, then the Actor writing its reply.
CHAT_STREAM_TIMEOUT_S: Final = 120
CHAT_STREAM_WRAPPER: Final = f'{LAMBDA_TASK_ROOT}/functions/api/stream_bootstrap'
CHAT_STREAM_FUNCTION: Final = FunctionSpec(
    'ChatStreamFunction',
    'functions.api.handler.chat_stream_handler',
    1024,
    CHAT_STREAM_TIMEOUT_S,
    'HTTP API chat turns, streamed (API Gateway response streaming)',
    'om-chat-stream',
    FunctionAccess(
        table_actions=_ALL_TABLE_ACTIONS,
        indexes=_DATA_INDEXES,
        object_actions=(*OBJECT_READ_ACTIONS, *OBJECT_WRITE_ACTIONS),
        lists_bucket=True,
        sends_jobs=True,
        starts_reflections=True,
        publishes_events=True,
        model_roles=('observer', 'reflector', 'actor', 'title', 'embedder'),
        streamed_roles=('actor',),
    ),
)
BUFFER_WORKER_FUNCTION: Final = FunctionSpec(
    'BufferWorkerFunction',
    'functions.buffer_worker.handler.lambda_handler',
    1536,
    600,
    'Background observation jobs from the work queue',
    'om-buffer-worker',
    FunctionAccess(
        table_actions=_ALL_TABLE_ACTIONS,
        indexes=_DATA_INDEXES,
        object_actions=(*OBJECT_READ_ACTIONS, *OBJECT_WRITE_ACTIONS),
        sends_jobs=True,
        consumes_jobs=True,
        starts_reflections=True,
        publishes_events=True,
        model_roles=('observer', 'reflector', 'title', 'embedder'),
    ),
)
REFLECTION_FUNCTION: Final = FunctionSpec(
    'ReflectionFunction',
    'functions.reflection.handler.lambda_handler',
    1536,
    600,
    'The reflection workflow tasks (check, reflect, validate, commit, release)',
    'om-reflection',
    FunctionAccess(
        # Reads and commits records and generations (a generation's superseded items go in one batch write).
        table_actions=(*TABLE_READ_ACTIONS, *TABLE_WRITE_ACTIONS),
        indexes=_DATA_INDEXES,
        object_actions=(*OBJECT_READ_ACTIONS, *OBJECT_WRITE_ACTIONS),
        publishes_events=True,
        model_roles=('reflector',),
    ),
    # Step Functions retries a throttled task with backoff (the ASL), so a cap costs delay, never a reflection.
    reserved_concurrency=10,
)
SWEEPER_FUNCTION: Final = FunctionSpec(
    'SweeperFunction',
    'functions.sweeper.handler.lambda_handler',
    1536,
    60,
    'Scheduled safety net: submits due or stale jobs',
    'om-sweeper',
    FunctionAccess(
        # Lists the attention index, reads threads, records and the newest message, clears finished entries.
        table_actions=('dynamodb:GetItem', 'dynamodb:Query', 'dynamodb:UpdateItem'),
        indexes=('LSI1', 'GSI2'),
        # A record's large values live in S3: reading a record may read its object.
        object_actions=OBJECT_READ_ACTIONS,
        sends_jobs=True,
        starts_reflections=True,
    ),
    # One sweep at a time: a slow sweep overlapping the next would submit the same jobs twice.
    reserved_concurrency=1,
)
ORPHAN_UPLOADS_FUNCTION: Final = FunctionSpec(
    'OrphanUploadsFunction',
    'functions.orphan_uploads.handler.lambda_handler',
    512,
    60,
    'Deletes attachment uploads that land after their thread was erased',
    'om-orphan-uploads',
    FunctionAccess(
        # Reads the thread's item (and its metadata document, in S3 when large); deletes attachment uploads. Every
        # object it may touch is a thread's (`<resource>/threads/<thread>/...`).
        table_actions=('dynamodb:GetItem',),
        indexes=(),
        object_actions=('s3:GetObject', 's3:DeleteObject'),
        object_keys='*/threads/*',
        consumes_upload_events=True,
    ),
)
ALL_FUNCTIONS: Final = (
    API_FUNCTION,
    CHAT_STREAM_FUNCTION,
    BUFFER_WORKER_FUNCTION,
    REFLECTION_FUNCTION,
    SWEEPER_FUNCTION,
    ORPHAN_UPLOADS_FUNCTION,
)

METRICS_NAMESPACE: Final = 'ObservationalMemory'
# The API answers within API Gateway's 29 s; models get this much of it (OM_REQUEST_TIME_BUDGET_S).
REQUEST_TIME_BUDGET_S: Final = 20

# ---- Work queue ----------------------------------------------------------------------------------------------------
# AWS: the queue's visibility timeout should be at least six times the consuming function's timeout.
QUEUE_VISIBILITY_FACTOR: Final = 6
# A job that met a model outage comes back after 30 s doubling to 15 min (om_lib.adapters.aws.work.retry_delay_s):
# ten receives ride out about an hour of outage before the job goes to the DLQ.
QUEUE_MAX_RECEIVES: Final = 10
QUEUE_RETENTION_DAYS: Final = 4
DLQ_RETENTION_DAYS: Final = 14
# One job per invocation: each job gets the invocation's whole time, and a slow one delays no other record.
QUEUE_BATCH_SIZE: Final = 1
# The event source's maximum concurrency: however long the backlog, at most this many worker invocations at once
# (the rest of the account's concurrency stays free for the API). Lambda's minimum is 2.
QUEUE_MAX_CONCURRENCY: Final = 10

# ---- Upload events: S3 → EventBridge → SQS → the orphan-upload function ----------------------------------------------
# A delete is quick and idempotent: batches of ten, a few retries before the dead-letter queue.
UPLOAD_EVENTS_BATCH_SIZE: Final = 10
UPLOAD_EVENTS_MAX_RECEIVES: Final = 5
# The optional lifecycle events queue: receives before an event goes to its dead-letter queue.
LIFECYCLE_QUEUE_MAX_RECEIVES: Final = 5
# However many uploads arrive, at most this many invocations at once (Lambda's minimum): the API keeps its concurrency.
UPLOAD_EVENTS_MAX_CONCURRENCY: Final = 2

# ---- Bucket ----------------------------------------------------------------------------------------------------------
# Versioning keeps what a bug or a stolen credential overwrites or deletes for this long; erased data is gone for good
# after it too (DELETE /resources/{id} leaves only these recovery copies behind, then nothing).
BUCKET_NONCURRENT_EXPIRY_DAYS: Final = 7
BUCKET_ABORT_UPLOADS_DAYS: Final = 1
BUCKET_INFREQUENT_ACCESS_DAYS: Final = 90

# ---- API -------------------------------------------------------------------------------------------------------------
API_RATE_LIMIT: Final = 50
API_BURST_LIMIT: Final = 100
AUTH_MODES: Final = ('iam', 'jwt', 'none')
DEFAULT_AUTH_CLAIM: Final = 'sub'
# WAF's per-IP rate rule: requests per client IP in a 5-minute window (20 a second sustained) before it blocks.
WAF_RATE_LIMIT_PER_5_MIN: Final = 6000
# Usage plan of the optional API keys (`-c apiKeys=name,...`): per key, on top of the stage's throttling.
USAGE_PLAN_RATE_LIMIT: Final = 20
USAGE_PLAN_BURST_LIMIT: Final = 40
USAGE_PLAN_QUOTA_PER_DAY: Final = 100_000

# ---- Schedule --------------------------------------------------------------------------------------------------------
SWEEP_EVERY_MINUTES: Final = 5

# ---- Alarms ----------------------------------------------------------------------------------------------------------
ALARM_PERIOD_MINUTES: Final = 5
FUNCTION_ERRORS_THRESHOLD: Final = 1
FUNCTION_THROTTLES_THRESHOLD: Final = 1
# API Gateway's 5XXError averaged over a period is the share of requests answered 5xx.
API_5XX_RATE_THRESHOLD: Final = 0.05
# A step waits for a model at most OM_REQUEST_TIME_BUDGET_S (20 s); a p99 this high for 3 periods means they do.
API_P99_LATENCY_MS: Final = 15_000
API_LATENCY_PERIODS: Final = 3
# Failure reasons that mean something is broken (CONTRACT §2); `deferred`, `conflict`, `not_smaller` and
# `not_under_target` are the system working as designed and go on the dashboard only.
ALARMED_FAILURE_REASONS: Final = ('error', 'timeout')
# Observation failures of those reasons in one period before the alarm fires (one is a blip the next step retries).
OBSERVATION_FAILURES_THRESHOLD: Final = 5
REFLECTION_FAILURES_THRESHOLD: Final = 1
# Business metrics (functions/_observability.py) and the services that emit them.
OBSERVATION_FAILURES_METRIC: Final = 'ObservationFailures'
REFLECTION_FAILURES_METRIC: Final = 'ReflectionFailures'

# ---- Outputs (logical ids fixed: tests and scripts read them) --------------------------------------------------------
OUTPUT_API_URL: Final = 'ApiUrl'
OUTPUT_API_ID: Final = 'ApiId'
OUTPUT_TABLE_NAME: Final = 'TableName'
OUTPUT_BUCKET_NAME: Final = 'BucketName'
OUTPUT_WORK_QUEUE_URL: Final = 'WorkQueueUrl'
OUTPUT_DEAD_LETTER_QUEUE_URL: Final = 'DeadLetterQueueUrl'
OUTPUT_STATE_MACHINE_ARN: Final = 'ReflectionStateMachineArn'
OUTPUT_GEMINI_SECRET_ARN: Final = 'GeminiSecretArn'
OUTPUT_OPENAI_SECRET_ARN: Final = 'OpenAISecretArn'
OUTPUT_ALARM_TOPIC_ARN: Final = 'AlarmTopicArn'
OUTPUT_AUTH_MODE: Final = 'AuthMode'
OUTPUT_KEY_ARN: Final = 'KeyArn'
OUTPUT_WEB_ACL_ARN: Final = 'WebAclArn'
OUTPUT_DASHBOARD_NAME: Final = 'DashboardName'
OUTPUT_USAGE_PLAN_ID: Final = 'UsagePlanId'
OUTPUT_EVENT_BUS_NAME: Final = 'LifecycleEventBusName'
OUTPUT_EVENT_BUS_ARN: Final = 'LifecycleEventBusArn'
OUTPUT_EVENTS_QUEUE_URL: Final = 'LifecycleEventsQueueUrl'

DEFAULT_STAGE: Final = 'dev'
STACK_NAME_PREFIX: Final = 'om-memory'

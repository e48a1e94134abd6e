"""Builds engines for local runs: config, tokenizer, model providers, store, clock."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from om_lib.clock import SystemClock
from om_lib.config import OMConfig
from om_lib.engine import MemoryEngine
from om_lib.model_router import ModelRouter
from om_lib.offline_model import STARTUP_NOTICE, OfflineLanguageModel
from om_lib.ports import Clock, LanguageModel, MemoryStore
from om_lib.tokens import TokenCounter

CREDENTIAL_VARS = ('GEMINI_API_KEY', 'GOOGLE_API_KEY')


def has_model_credentials(env: Mapping[str, str]) -> bool:
    """True when a Gemini key (or a Gemini-compatible base URL, e.g. a gateway or a test double) is configured."""
    return any(env.get(name) for name in CREDENTIAL_VARS) or bool(env.get('GOOGLE_GEMINI_BASE_URL'))


@dataclass(frozen=True)
class Providers:
    """Model providers by name, and whether everything was routed to the offline model."""

    providers: dict[str, LanguageModel]
    offline: bool


def build_providers(env: Mapping[str, str] | None = None) -> Providers:
    """`google` → Gemini when credentials exist; otherwise every provider name runs on the offline model."""
    env = os.environ if env is None else env
    offline_model = OfflineLanguageModel()
    if not has_model_credentials(env):
        return Providers({'google': offline_model, 'offline': offline_model}, offline=True)
    from om_lib.adapters.gemini_model import GeminiLanguageModel

    api_key = env.get('GEMINI_API_KEY') or env.get('GOOGLE_API_KEY') or 'unset'
    gemini = GeminiLanguageModel(api_key=api_key, base_url=env.get('GOOGLE_GEMINI_BASE_URL') or None)
    return Providers({'google': gemini, 'offline': offline_model}, offline=False)


def build_engine(
    config: OMConfig,
    *,
    store: MemoryStore,
    clock: Clock | None = None,
    env: Mapping[str, str] | None = None,
    time_budget_s: float = 20.0,
    announce: bool = True,
) -> MemoryEngine:
    """A MemoryEngine over the given store, with the o200k counter and the providers the environment allows."""
    from om_lib.adapters.tiktoken_counter import get_tokenizer

    clock = clock or SystemClock()
    providers = build_providers(env)
    if providers.offline and announce:
        print(STARTUP_NOTICE, file=sys.stderr)
    router = ModelRouter(providers.providers, clock=clock)
    return MemoryEngine(
        config,
        store=store,
        router=router,
        counter=TokenCounter(get_tokenizer()),
        clock=clock,
        time_budget_s=time_budget_s,
    )

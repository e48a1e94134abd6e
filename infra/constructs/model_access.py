"""ModelAccess: what calling each configured model provider takes, granted only to the functions that call it.

The OM configuration names the models of each role (Observer, Reflector, the chat endpoint's Actor, titles) and the
service settings name the embedder. `configured_models` reads them, `providers_for` says which providers a function
reaches given the roles it plays (`FunctionAccess.model_roles`), and `ModelAccess.grant` gives that function what each
of those providers needs:

- `google`: read the Gemini key's secret (decrypting it with the stack's key), and its ARN in OM_GEMINI_SECRET_ARN;
- `offline`: nothing (the built-in model runs in process).

A provider added to `om_lib.config.KNOWN_PROVIDERS` must get a branch in `grant` (synth refuses a configuration naming
one that has none): Bedrock would add `bedrock:InvokeModel` on the foundation-model ARNs of the configured model ids
(`ModelRef.model_id`), an OpenAI-compatible provider a secret like Gemini's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from constructs import Construct

from functions._wiring import ServiceSettings
from infra.constructs.gemini_secret import GeminiSecret
from infra.constructs.memory_key import MemoryKey
from infra.constructs.service_function import ServiceFunction
from om_lib.config import OMConfig
from om_lib.model_spec import ModelByInputTokens, ModelFallbacks, ModelRef, ModelSpec

MODEL_ROLES = ('observer', 'reflector', 'actor', 'title', 'embedder')
# The embedder the functions use unless OM_EMBEDDING_MODEL says otherwise (the stack does not set it).
DEFAULT_EMBEDDING_MODEL: str = ServiceSettings.model_fields['OM_EMBEDDING_MODEL'].default


def _refs(spec: ModelSpec) -> frozenset[ModelRef]:
    """Every model a role's spec can pick: one, each size tier, or each fallback."""
    if isinstance(spec, ModelRef):
        return frozenset({spec})
    if isinstance(spec, ModelByInputTokens):
        return frozenset(ref for _, ref in spec.tiers)
    if isinstance(spec, ModelFallbacks):
        return frozenset(ref for ref, _ in spec.entries)
    raise TypeError(f'unknown model spec {spec!r}')


def configured_models(
    config: OMConfig, *, embedding_model: str = DEFAULT_EMBEDDING_MODEL
) -> dict[str, frozenset[ModelRef]]:
    """The models each role may call with this configuration (an empty set for a role that is off)."""
    resolved = config.resolved()
    titles = resolved.title_generation
    # As functions._wiring.semantic(): the embedder runs only for semantic search or semantic recall.
    embeds = (resolved.retrieval is not None and resolved.retrieval.vector) or resolved.semantic_recall is not None
    return {
        'observer': _refs(resolved.observer_model),
        'reflector': _refs(resolved.reflector_model),
        'actor': _refs(resolved.actor_model),
        'title': _refs(titles.model) if titles is not None else frozenset(),
        'embedder': frozenset({ModelRef.parse(embedding_model)}) if embeds else frozenset(),
    }


def providers_for(roles: Iterable[str], models: Mapping[str, frozenset[ModelRef]]) -> frozenset[str]:
    """The providers a function playing `roles` calls."""
    unknown = set(roles) - set(MODEL_ROLES)
    if unknown:
        raise ValueError(f'unknown model roles {sorted(unknown)}; known: {", ".join(MODEL_ROLES)}')
    return frozenset(ref.provider for role in roles for ref in models.get(role, frozenset()))


class ModelAccess(Construct):
    """The configured models' providers, and per provider what a function calling it is granted."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: OMConfig,
        key: MemoryKey,
        gemini_secret_arn: str | None = None,
        gemini_secret_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.models = configured_models(config)
        self.providers = providers_for(MODEL_ROLES, self.models)
        unsupported = self.providers - {'google', 'offline'}
        if unsupported:
            raise ValueError(
                f'the configuration names models of {sorted(unsupported)}, for which the stack grants nothing yet: '
                'add the provider to infra/constructs/model_access.py'
            )
        # Only a stack that calls Gemini has (or imports) the Gemini key's secret.
        self.gemini_secret = (
            GeminiSecret(scope, 'GeminiSecret', key=key, secret_arn=gemini_secret_arn, secret_name=gemini_secret_name)
            if 'google' in self.providers
            else None
        )

    def grant(self, function: ServiceFunction, roles: Iterable[str]) -> frozenset[str]:
        """Give `function` what calling its roles' providers takes; returns those providers."""
        providers = providers_for(roles, self.models)
        if 'google' in providers:
            assert self.gemini_secret is not None
            self.gemini_secret.grant_read(function.role, sid=function.spec.construct_id)
            # The key's location, never the key: the function reads it from Secrets Manager on its first model call.
            function.function.add_environment('OM_GEMINI_SECRET_ARN', self.gemini_secret.secret_arn)
        return providers

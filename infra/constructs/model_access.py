"""ModelAccess: which function may call which model provider, and what calling it takes. The one place for it.

The OM configuration names the models of each role (Observer, Reflector, the chat endpoint's Actor, titles) and
`OM_EMBEDDING_MODEL` the embedder. `configured_models` reads them (every `upTo` tier and fallback entry; roles that are
off call nothing), `providers_for` says which providers a function reaches given the roles it plays
(`FunctionAccess.model_roles`), and `ModelAccess.grant` gives that function what each of those providers needs:

- `google`: read the Gemini key's secret (decrypting it with the stack's key), its ARN in OM_GEMINI_SECRET_ARN;
- `openai`: the same for the OpenAI key (OM_OPENAI_SECRET_ARN), and OPENAI_BASE_URL when the deployment sets one;
- `bedrock`: `bedrock:InvokeModel` on the ARNs of exactly the configured Bedrock models (`bedrock_resources`);
- `offline`: nothing (the built-in model runs in process).

A secret exists only when some function calls its provider: an all-Bedrock stack has none.

Bedrock ARNs, never `*` (`bedrock_resources`, pure, so the rule is tested on plain values):

* a foundation-model id → that model's ARN in the stack's region;
* an inference-profile id (`us.`, `eu.`, `apac.`, `global.` ...) or ARN → the profile's ARN, plus its foundation model
  in any region *only through that profile* (`bedrock:InferenceProfileArn` condition): the profile routes to regions
  that change over time, so they cannot be listed, and the condition keeps direct calls to the model out;
* an application-inference-profile ARN → the profile, plus whatever foundation model it wraps, only through it;
* any other ARN (provisioned throughput, custom or imported model) → that ARN.

`bedrock:InvokeModel` authorises Converse and InvokeModel (Bedrock has no separate `bedrock:Converse` action);
ConverseStream needs `bedrock:InvokeModelWithResponseStream`, granted only for the roles a function streams
(`FunctionAccess.streamed_roles`: the chat stream's Actor).

A provider added to `om_lib.config.KNOWN_PROVIDERS` must get a branch in `grant` (synth refuses a configuration naming
one that has none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.constants import ALL_FUNCTIONS, KMS_DECRYPT_ACTIONS
from infra.constructs.memory_key import SECRETS_MANAGER, MemoryKey
from infra.constructs.model_key_secret import ModelKeySecret
from infra.constructs.nag import acknowledge, nag_text
from infra.constructs.service_function import ServiceFunction
from om_lib.adapters.models.bedrock import foundation_model_id
from om_lib.config import OMConfig
from om_lib.models.embedders import DEFAULT_EMBEDDING_MODEL
from om_lib.models.model_spec import ModelRef

MODEL_ROLES = ('observer', 'reflector', 'actor', 'title', 'embedder')
# Providers whose API key lives in a secret: provider → (construct id and name in outputs, the functions' variable).
KEY_PROVIDERS: Mapping[str, tuple[str, str]] = {
    'google': ('Gemini', 'OM_GEMINI_SECRET_ARN'),
    'openai': ('OpenAI', 'OM_OPENAI_SECRET_ARN'),
}
GRANTED_PROVIDERS = frozenset({'bedrock', 'offline', *KEY_PROVIDERS})

BEDROCK_INVOKE_ACTIONS = ('bedrock:InvokeModel',)
BEDROCK_STREAM_ACTIONS = ('bedrock:InvokeModelWithResponseStream',)
# The condition key that says which inference profile a foundation-model call came through.
INFERENCE_PROFILE_CONDITION = 'bedrock:InferenceProfileArn'


# ---- which models each role calls ------------------------------------------------------------------------------------


def configured_models(
    config: OMConfig, *, embedding_model: str = DEFAULT_EMBEDDING_MODEL
) -> dict[str, tuple[ModelRef, ...]]:
    """The models each role may call with this configuration, in order (empty for a role that is off)."""
    resolved = config.resolved()
    by_role: dict[str, tuple[ModelRef, ...]] = dict.fromkeys(MODEL_ROLES, ())
    by_role.update(resolved.models_by_role().items())
    # As functions._wiring.semantic(): the embedder runs only for semantic search or recall; `local` and `hashing`
    # run in process.
    if resolved.semantic_search and '/' in embedding_model:
        by_role['embedder'] = (ModelRef.parse(embedding_model),)
    return by_role


def _models_of(roles: Iterable[str], models: Mapping[str, tuple[ModelRef, ...]]) -> list[ModelRef]:
    roles = list(roles)
    unknown = set(roles) - set(MODEL_ROLES)
    if unknown:
        raise ValueError(f'unknown model roles {sorted(unknown)}; known: {", ".join(MODEL_ROLES)}')
    return [ref for role in roles for ref in models.get(role, ())]


def providers_for(roles: Iterable[str], models: Mapping[str, tuple[ModelRef, ...]]) -> frozenset[str]:
    """The providers a function playing `roles` calls."""
    return frozenset(ref.provider for ref in _models_of(roles, models))


# ---- what calling them takes (pure values) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Arns:
    """Where the stack runs; CDK tokens (`Aws.PARTITION` ...) in the stack, plain strings in tests."""

    partition: str
    region: str
    account: str

    def foundation_model(self, model_id: str, *, region: str | None = None) -> str:
        """A foundation model's ARN (`region='*'`: in every region)."""
        return f'arn:{self.partition}:bedrock:{self.region if region is None else region}::foundation-model/{model_id}'

    def inference_profile(self, profile_id: str) -> str:
        """A system-defined (cross-region) inference profile's ARN in this account and region."""
        return f'arn:{self.partition}:bedrock:{self.region}:{self.account}:inference-profile/{profile_id}'


@dataclass(frozen=True)
class ModelGrants:
    """What calling some models takes.

    Attributes:
        bedrock: ARNs to allow `bedrock:InvokeModel` on, unconditionally.
        bedrock_via_profile: inference-profile ARN → foundation-model ARNs allowed only through that profile.
        secrets: Providers whose API key must be read (`google`, `openai`).
    """

    bedrock: tuple[str, ...] = ()
    bedrock_via_profile: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        """No model access at all."""
        return not (self.bedrock or self.bedrock_via_profile or self.secrets)


def bedrock_resources(model_id: str, arns: Arns) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """(ARNs to allow directly, {profile ARN: foundation-model ARNs allowed only through it}) for one Bedrock id."""
    if model_id.startswith('arn:'):
        resource = model_id.split(':', 5)[-1]  # `inference-profile/us.amazon...`, `foundation-model/...`
        kind, _, name = resource.partition('/')
        if kind == 'inference-profile':
            wildcard = arns.foundation_model(foundation_model_id(name), region='*')
            return (model_id,), {model_id: (wildcard,)}
        if kind == 'application-inference-profile':
            # The wrapped model is not in the ARN; the condition still ties every call to this one profile.
            return (model_id,), {model_id: (arns.foundation_model('*', region='*'),)}
        return (model_id,), {}
    bare = foundation_model_id(model_id)
    if bare != model_id:  # a geography prefix: a system-defined cross-region inference profile
        profile = arns.inference_profile(model_id)
        return (profile,), {profile: (arns.foundation_model(bare, region='*'),)}
    return (arns.foundation_model(model_id),), {}


def model_grants(models: Iterable[ModelRef], arns: Arns) -> ModelGrants:
    """The grants for calling `models` (duplicates folded, order kept)."""
    direct: list[str] = []
    via: dict[str, list[str]] = {}
    for ref in models:
        if ref.provider != 'bedrock':
            continue
        resources, through = bedrock_resources(ref.model_id, arns)
        direct += [arn for arn in resources if arn not in direct]
        for profile, targets in through.items():
            via.setdefault(profile, [])
            via[profile] += [arn for arn in targets if arn not in via[profile]]
    return ModelGrants(
        bedrock=tuple(direct),
        bedrock_via_profile={profile: tuple(targets) for profile, targets in via.items()},
        secrets=frozenset(ref.provider for ref in models if ref.provider in KEY_PROVIDERS),
    )


def function_grants(
    config: OMConfig, arns: Arns, *, embedding_model: str = DEFAULT_EMBEDDING_MODEL
) -> dict[str, ModelGrants]:
    """Each function's (construct id →) model grants, from the roles its `FunctionAccess` lists."""
    models = configured_models(config, embedding_model=embedding_model)
    return {
        spec.construct_id: model_grants(_models_of(spec.access.model_roles, models), arns) for spec in ALL_FUNCTIONS
    }


# ---- the construct ---------------------------------------------------------------------------------------------------


class ModelAccess(Construct):
    """The configured models' providers, their API-key secrets, and per function the grants its roles need."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: OMConfig,
        key: MemoryKey,
        embedding_model: str | None = None,
        openai_base_url: str | None = None,
        gemini_secret_arn: str | None = None,
        gemini_secret_name: str | None = None,
        openai_secret_arn: str | None = None,
        openai_secret_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.key = key
        self.openai_base_url = openai_base_url
        self.models = configured_models(config, embedding_model=embedding_model or DEFAULT_EMBEDDING_MODEL)
        self.providers = providers_for(MODEL_ROLES, self.models)
        unsupported = self.providers - GRANTED_PROVIDERS
        if unsupported:
            raise ValueError(
                f'the configuration names models of {sorted(unsupported)}, for which the stack grants nothing yet: '
                'add the provider to infra/constructs/model_access.py'
            )
        stack = Stack.of(self)
        self.arns = Arns(partition=stack.partition, region=stack.region, account=stack.account)
        existing = {
            'google': (gemini_secret_arn, gemini_secret_name),
            'openai': (openai_secret_arn, openai_secret_name),
        }
        # Only a stack that calls a provider has (or imports) its key's secret; ids as before, at the stack's top.
        self.secrets: dict[str, ModelKeySecret] = {
            provider: ModelKeySecret(
                scope,
                f'{name}Secret',
                provider=name,
                key=key,
                secret_arn=existing[provider][0],
                secret_name=existing[provider][1],
            )
            for provider, (name, _variable) in KEY_PROVIDERS.items()
            if provider in self.providers
        }

    @property
    def gemini_secret(self) -> ModelKeySecret | None:
        """The Gemini key's secret, when a `google/` model is configured."""
        return self.secrets.get('google')

    @property
    def openai_secret(self) -> ModelKeySecret | None:
        """The OpenAI key's secret, when an `openai/` model is configured."""
        return self.secrets.get('openai')

    def grant(self, function: ServiceFunction, roles: Iterable[str], streamed: Iterable[str] = ()) -> frozenset[str]:
        """Give `function` what calling its roles' models takes (and streaming the `streamed` roles' answers); returns
        their providers."""
        refs = _models_of(roles, self.models)
        grants = model_grants(refs, self.arns)
        self._grant_bedrock(function, grants)
        self._grant_bedrock(
            function, model_grants(_models_of(streamed, self.models), self.arns), BEDROCK_STREAM_ACTIONS
        )
        readable = [self.secrets[provider] for provider in sorted(grants.secrets)]
        for provider in sorted(grants.secrets):
            self.secrets[provider].grant_read(function.role)
            # The key's location, never the key: the function reads it from Secrets Manager on its first model call.
            function.function.add_environment(KEY_PROVIDERS[provider][1], self.secrets[provider].secret_arn)
        if any(secret.created for secret in readable):
            # One key-policy statement however many of the stack's secrets it reads (imported ones keep their key).
            self.key.allow(
                f'{function.spec.construct_id}ReadsTheModelKey', function.role, KMS_DECRYPT_ACTIONS, [SECRETS_MANAGER]
            )
        if 'openai' in grants.secrets and self.openai_base_url:
            function.function.add_environment('OPENAI_BASE_URL', self.openai_base_url)
        return frozenset(ref.provider for ref in refs)

    def _grant_bedrock(
        self, function: ServiceFunction, grants: ModelGrants, actions: tuple[str, ...] = BEDROCK_INVOKE_ACTIONS
    ) -> None:
        if grants.bedrock:
            function.role.add_to_policy(iam.PolicyStatement(actions=list(actions), resources=list(grants.bedrock)))
        for profile, models in grants.bedrock_via_profile.items():
            function.role.add_to_policy(
                iam.PolicyStatement(
                    actions=list(actions),
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

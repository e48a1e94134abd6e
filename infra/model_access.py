"""The model access each function needs, from the configuration: Bedrock resources to invoke, API-key secrets to read.

Pure values (no CDK objects), so the rule is tested on its own and the stack only turns it into policy statements.
A function gets access only for the roles it runs (`FUNCTION_ROLES`) and only to the models those roles may call
(every `upTo` tier and fallback entry). Bedrock grants are never `*`:

* a foundation-model id → that model's ARN in the stack's region;
* an inference-profile id (`us.`, `eu.`, `apac.`, `global.` ...) or ARN → the profile's ARN, plus its foundation model
  in any region *only through that profile* (`bedrock:InferenceProfileArn` condition): the profile routes to regions
  that change over time, so they cannot be listed, and the condition keeps direct calls to the model out;
* an application-inference-profile ARN → the profile, plus whatever foundation model it wraps, only through it;
* any other ARN (provisioned throughput, custom or imported model) → that ARN.

`bedrock:InvokeModel` is the only action: Converse and InvokeModel both authorise with it (Bedrock has no separate
`bedrock:Converse` action), and nothing here streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from infra.constants import API_FUNCTION, BUFFER_WORKER_FUNCTION, REFLECTION_FUNCTION, SWEEPER_FUNCTION
from om_lib.adapters.bedrock_model import foundation_model_id
from om_lib.config import ModelRole, ResolvedOMConfig
from om_lib.model_spec import ModelRef

Role = ModelRole | Literal['embedding']
KeyProvider = Literal['google', 'openai']

# Which roles each function runs. The API serves steps (sync observation and reflection), chat (the Actor, its tools,
# titles) and searches (query embeddings); the worker runs background observation, buffered reflection, titles and
# embedding jobs; the reflection workflow only reflects; the sweeper only queues work.
FUNCTION_ROLES: Mapping[str, tuple[Role, ...]] = {
    API_FUNCTION.construct_id: ('observer', 'reflector', 'actor', 'title', 'embedding'),
    BUFFER_WORKER_FUNCTION.construct_id: ('observer', 'reflector', 'title', 'embedding'),
    REFLECTION_FUNCTION.construct_id: ('reflector',),
    SWEEPER_FUNCTION.construct_id: (),
}

BEDROCK_INVOKE_ACTIONS = ('bedrock:InvokeModel',)
# The condition key that says which inference profile a foundation-model call came through.
INFERENCE_PROFILE_CONDITION = 'bedrock:InferenceProfileArn'


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
class ModelAccess:
    """What one function may call.

    Attributes:
        bedrock: ARNs to allow `bedrock:InvokeModel` on, unconditionally.
        bedrock_via_profile: inference-profile ARN → foundation-model ARNs allowed only through that profile.
        secrets: Providers whose API key the function reads (`google`, `openai`).
    """

    bedrock: tuple[str, ...] = ()
    bedrock_via_profile: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    secrets: frozenset[KeyProvider] = frozenset()

    @property
    def empty(self) -> bool:
        """No model access at all."""
        return not (self.bedrock or self.bedrock_via_profile or self.secrets)


def models_for(config: ResolvedOMConfig, roles: Iterable[Role], *, embedding_model: str | None) -> list[ModelRef]:
    """The models `roles` may call under `config`; `embedding_model` counts only when semantic search is on."""
    by_role = config.models_by_role()
    refs: list[ModelRef] = []
    for role in roles:
        if role == 'embedding':
            if config.semantic_search and embedding_model and '/' in embedding_model:
                refs.append(ModelRef.parse(embedding_model))
        else:
            refs.extend(by_role.get(role, ()))
    return refs


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


def model_access(models: Iterable[ModelRef], arns: Arns) -> ModelAccess:
    """The grants for calling `models` (duplicates folded, order kept)."""
    direct: list[str] = []
    via: dict[str, list[str]] = {}
    secrets: set[KeyProvider] = set()
    for ref in models:
        if ref.provider == 'bedrock':
            resources, through = bedrock_resources(ref.model_id, arns)
            direct += [arn for arn in resources if arn not in direct]
            for profile, targets in through.items():
                via.setdefault(profile, [])
                via[profile] += [arn for arn in targets if arn not in via[profile]]
        elif ref.provider in ('google', 'openai'):
            secrets.add('google' if ref.provider == 'google' else 'openai')
    return ModelAccess(
        bedrock=tuple(direct),
        bedrock_via_profile={profile: tuple(targets) for profile, targets in via.items()},
        secrets=frozenset(secrets),
    )


def function_access(config: ResolvedOMConfig, arns: Arns, *, embedding_model: str | None) -> dict[str, ModelAccess]:
    """Each function's (construct id →) model access."""
    return {
        function: model_access(models_for(config, roles, embedding_model=embedding_model), arns)
        for function, roles in FUNCTION_ROLES.items()
    }

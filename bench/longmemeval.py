"""LongMemEval on this memory service: replay each question's dated history, ask the question on its date, grade the
reply with LongMemEval's judge prompts, and report accuracy, tokens and cost beside the published figures.

    .venv/bin/python bench/longmemeval.py run DATA.json [--out DIR] [--limit N] [--types T,...] [--parallel N]
        [--observer-model M] [--reflector-model M] [--actor-model M] [--judge M|exact] [--scope resource|thread]
        [--config FILE] [--message-tokens N] [--observation-tokens N] [--api-url URL --auth none|iam|bearer]
    .venv/bin/python bench/longmemeval.py report DIR
    .venv/bin/python bench/longmemeval.py estimate [--questions 500] [--tokens-per-question 115000] [models...]

`run` drives the local stack in this process (the deployed architecture on an embedded AWS emulator, with the model
providers named per role) or, with `--api-url`, a deployed stack through the Python client. Results are appended to
DIR/results.jsonl as each question finishes; a rerun with the same settings skips the questions already graded.
DIR/report.md, report.json and accuracy_by_type.png are written at the end (and by `report`). The defaults are the
reference's published setting: Observer and Reflector google/gemini-2.5-flash, Actor openai/gpt-4o, judge
openai/gpt-4o. `--judge exact` grades by exact match without a model (smoke runs; not comparable).

docs/longmemeval.md says where to get the data, what a run costs and how to read the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.lme import data as lme_data  # noqa: E402 - after the path set-up, so the file runs as a script
from bench.lme import report as lme_report  # noqa: E402
from bench.lme import runner  # noqa: E402
from bench.lme.judge import make_judge  # noqa: E402
from bench.lme.usage import ModelMeter, model_prices, price_of  # noqa: E402

REFERENCE_MODELS = {
    'observer': 'google/gemini-2.5-flash',
    'reflector': 'google/gemini-2.5-flash',
    'actor': 'openai/gpt-4o',
}
REFERENCE_JUDGE = 'openai/gpt-4o'
CREDENTIALS = {
    'google': ('GEMINI_API_KEY', 'GOOGLE_API_KEY', 'GOOGLE_GEMINI_BASE_URL'),
    'openai': ('OPENAI_API_KEY', 'OPENAI_BASE_URL'),
    'bedrock': ('OM_BEDROCK_PROFILE', 'AWS_ENDPOINT_URL_BEDROCK_RUNTIME'),
}
STACK_NAMES = {
    'table': 'om-lme',
    'bucket': 'om-lme',
    'queue': 'om-lme-work.fifo',
    'dead_letter_queue': 'om-lme-dlq.fifo',
}


class UsageError(Exception):
    """A setting the run cannot start with; the message says how to fix it."""


# -- settings --------------------------------------------------------------------------------------------------------
def stack_config(args: argparse.Namespace) -> dict[str, Any]:
    """The OM configuration of the local stack: `--config`, with the harness's models, scope and thresholds."""
    base: dict[str, Any] = {}
    if args.config:
        try:
            base = json.loads(Path(args.config).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f'--config {args.config}: {exc}') from None
        if not isinstance(base, dict):
            raise UsageError(f'--config {args.config} must hold a JSON object (the OM configuration document)')
    base.pop('model', None)  # the roles' models are the harness's options
    observation = {**base.get('observation', {}), 'model': args.observer_model}
    reflection = {**base.get('reflection', {}), 'model': args.reflector_model}
    if args.message_tokens:
        observation['messageTokens'] = args.message_tokens
    if args.observation_tokens:
        reflection['observationTokens'] = args.observation_tokens
    config = {**base, 'scope': args.scope, 'observation': observation, 'reflection': reflection}
    config['actorModel'] = args.actor_model
    from om_lib.config import OMConfig

    try:
        OMConfig.model_validate(config)
    except ValueError as exc:
        raise UsageError(f'the memory configuration is not valid: {exc}') from None
    return config


def thresholds_of(config: Mapping[str, Any]) -> dict[str, Any]:
    from om_lib.config import OMConfig

    resolved = OMConfig.model_validate(config).resolved()
    return {'messageTokens': resolved.message_tokens, 'observationTokens': resolved.observation_tokens}


def check_credentials(models: Sequence[str]) -> None:
    """Every provider the run uses can be reached; a benchmark must never fall back to the offline model quietly."""
    for name in models:
        provider = name.split('/', 1)[0]
        if provider == 'offline' or provider not in CREDENTIALS:
            if provider not in (*CREDENTIALS, 'offline'):
                raise UsageError(f'{name}: unknown provider {provider!r}; use google/…, bedrock/…, openai/… or offline')
            continue
        if not any(os.environ.get(var) for var in CREDENTIALS[provider]):
            raise UsageError(
                f'{name} needs credentials: set {" or ".join(CREDENTIALS[provider])} (see docs/longmemeval.md)'
            )


def model_providers() -> dict[str, Any]:
    """Providers for the judge, built like the service's own (the same adapters)."""
    from om_lib.adapters.models.bedrock import BedrockLanguageModel
    from om_lib.adapters.models.gemini import GeminiLanguageModel
    from om_lib.adapters.models.openai import OpenAILanguageModel
    from om_lib.models.offline_model import OfflineLanguageModel

    return {
        'google': GeminiLanguageModel(
            api_key=os.environ.get('GEMINI_API_KEY') or os.environ.get('GOOGLE_API_KEY') or None,
            base_url=os.environ.get('GOOGLE_GEMINI_BASE_URL') or None,
        ),
        'bedrock': BedrockLanguageModel(profile_name=os.environ.get('OM_BEDROCK_PROFILE') or None),
        'openai': OpenAILanguageModel(),
        'offline': OfflineLanguageModel(),
    }


def progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit='question', dynamic_ncols=True, file=sys.stderr)


# -- run -------------------------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    questions = lme_data.load_questions(args.data, types=args.types, limit=args.limit)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deployed = bool(args.api_url)
    if deployed and (args.config or args.message_tokens or args.observation_tokens or args.models_given):
        raise UsageError(
            'a deployed stack runs with its own configuration (models, thresholds, scope): drop --config, the model '
            'and threshold options, or run on the local stack'
        )
    if not 0 < args.time_budget <= 28:
        raise UsageError('--time-budget must be more than 0 and at most 28 seconds (API Gateway stops a request at 29)')
    config = None if deployed else stack_config(args)
    models = (
        {}
        if deployed
        else dict(REFERENCE_MODELS)
        | {
            'observer': args.observer_model,
            'reflector': args.reflector_model,
            'actor': args.actor_model,
        }
    )
    check_credentials([*models.values(), *([] if args.judge == 'exact' else [args.judge])])
    run = {
        'dataset': str(Path(args.data).resolve()),
        'stack': 'deployed' if deployed else 'local',
        'api_url': args.api_url,
        'scope': args.scope if not deployed else 'the stack’s',
        'models': models,
        'judge': args.judge,
        'thresholds': thresholds_of(config) if config is not None else 'the stack’s',
        'config': config,
        'started': runner.now_iso(),
    }
    runner.check_resumable(out, run)
    results = runner.ResultsFile(out)
    done = results.done()
    todo = [q for q in questions if q.question_id not in done]
    already = len(done & {q.question_id for q in questions})
    print(
        f'{len(questions)} questions in {Path(args.data).name} ({_counts(questions)}); {already} graded already, '
        f'{len(todo)} to run; results in {out / runner.RESULTS}',
        file=sys.stderr,
    )
    if not todo:
        return cmd_report(argparse.Namespace(dir=str(out)))
    judge = make_judge(args.judge, None if args.judge == 'exact' else model_providers())
    prices = model_prices()
    if deployed:
        _run_deployed(args, questions, results, judge, prices)
    else:
        assert config is not None
        _run_local(args, config, questions, results, judge, prices)
    return cmd_report(argparse.Namespace(dir=str(out)))


def _counts(questions: Sequence[lme_data.Question]) -> str:
    return ', '.join(f'{n} {t}' for t, n in lme_data.type_counts(questions).items())


def _run_deployed(args: argparse.Namespace, questions: Any, results: Any, judge: Any, prices: Any) -> None:
    from om_client import BearerAuth, MemoryClient

    auth: Any = args.auth
    if args.auth == 'bearer':
        token = os.environ.get(args.token_env, '')
        if not token:
            raise UsageError(f'--auth bearer reads the token from ${args.token_env}; set it (or use --token-env)')
        auth = BearerAuth(token)
    options = runner.Options(scope='resource', keep_resources=args.keep_resources, settle_timeout_s=args.settle_timeout)
    with MemoryClient(args.api_url, auth=auth, timeout=60.0) as client:

        def work(question: lme_data.Question) -> dict[str, Any]:
            return runner.run_question(client, question, judge, options, meter=None, prices=prices)

        runner.run_all(questions, results, work, parallel=args.parallel, progress=progress_bar)


def _run_local(
    args: argparse.Namespace, config: dict[str, Any], questions: Any, results: Any, judge: Any, prices: Any
) -> None:
    from om_client import MemoryClient

    from om_cli.local_stack import LocalStack, StackNames

    env = {
        'OM_OFFLINE_FALLBACK': '0',  # a provider without credentials fails loudly instead of answering offline
        'OM_REQUEST_TIME_BUDGET_S': str(args.time_budget),
        'POWERTOOLS_LOG_LEVEL': 'ERROR',
        'POWERTOOLS_METRICS_DISABLED': 'true',
    }
    names = StackNames(**STACK_NAMES, reflection_function='om-lme-reflection', state_machine='om-lme-reflection')
    stack = LocalStack(port=0, config=config, env=env, sweep_interval_s=None, names=names)
    meter = ModelMeter()
    with contextlib.ExitStack() as cleanup:
        # The functions print their metrics (CloudWatch EMF lines) to stdout, as in Lambda: not this run's output.
        devnull = cleanup.enter_context(open(os.devnull, 'w'))
        cleanup.enter_context(contextlib.redirect_stdout(devnull))
        stack.start()
        cleanup.callback(stack.stop)
        from functions import _wiring

        meter.install(_wiring.providers(), _wiring.service())
        cleanup.callback(meter.uninstall)

        def settle(client: Any, resource: str, thread: str) -> None:
            if args.parallel == 1:
                stack.drain(args.settle_timeout)  # exact: nothing else is running
            else:
                runner.settle_by_polling(client, resource, thread, timeout_s=args.settle_timeout, interval_s=1.0)

        options = runner.Options(scope=args.scope, keep_resources=args.keep_resources, settle=settle)
        client = cleanup.enter_context(MemoryClient(stack.url, timeout=300.0, retries=0))

        def work(question: lme_data.Question) -> dict[str, Any]:
            return runner.run_question(client, question, judge, options, meter=meter, prices=prices)

        runner.run_all(questions, results, work, parallel=args.parallel, progress=progress_bar)


# -- report ----------------------------------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    run_file = out / runner.RUN_FILE
    if not run_file.exists():
        raise UsageError(f'{out} holds no run ({runner.RUN_FILE} is missing): give the --out directory of a run')
    run = json.loads(run_file.read_text())
    summary = lme_report.write_report(out, runner.ResultsFile(out).records(), run)
    print(lme_report.console_summary(summary))
    print(f'report: {out / "report.md"}')
    return 0


# -- estimate --------------------------------------------------------------------------------------------------------
def estimate(
    *,
    questions: int,
    tokens_per_question: int,
    models: Mapping[str, str],
    judge: str,
    message_tokens: int,
    observation_tokens: int,
    compression: float,
) -> dict[str, Any]:
    """Projected tokens and cost of a run, from the prompts' real sizes and stated assumptions (docs/longmemeval.md)."""
    from om_lib.adapters.tiktoken_counter import get_tokenizer
    from om_lib.context.context import build_observation_system_messages
    from om_lib.conversation.chat import ACTOR_SYSTEM_PROMPT
    from om_lib.prompts.observer import build_observer_system_prompt
    from om_lib.prompts.reflector import build_reflector_system_prompt

    count = get_tokenizer().count
    observer_system = count(build_observer_system_prompt(multi_thread=True))
    reflector_system = count(build_reflector_system_prompt(build_observer_system_prompt()))
    from datetime import UTC, datetime

    memory_preamble = count(
        '\n\n'.join(
            build_observation_system_messages('x', now=datetime.now(UTC), current_task=None, suggested_response=None)
        )
    )
    t = tokens_per_question
    cycles = t // message_tokens  # an observation each time the backlog reaches the threshold
    tail = t - cycles * message_tokens  # the last sessions, still unobserved when the question comes
    per_cycle_out = message_tokens / compression
    observations = t / compression if cycles else 0.0
    reflections = (
        max(0, math.ceil((cycles * per_cycle_out - observation_tokens) / (observation_tokens / 2))) if cycles else 0
    )
    thinking = {'observer': 215, 'reflector': 1024}
    roles = {
        'observer': {
            'calls': cycles,
            'input_tokens': cycles * (message_tokens + observer_system) + per_cycle_out * cycles * (cycles - 1) / 2,
            'output_tokens': cycles * (per_cycle_out + thinking['observer']),
        },
        'reflector': {
            'calls': reflections,
            'input_tokens': reflections * (reflector_system + observation_tokens),
            'output_tokens': reflections * (observation_tokens / 2 + thinking['reflector']),
        },
        'actor': {
            'calls': 1,
            'input_tokens': count(ACTOR_SYSTEM_PROMPT) + memory_preamble + min(observations, observation_tokens) + tail,
            'output_tokens': 150,
        },
        'judge': {'calls': 1, 'input_tokens': 400, 'output_tokens': 2},
    }
    prices = model_prices()
    names = {**models, 'judge': judge}
    per_question: dict[str, float | None] = {}
    for role, use in roles.items():
        rates = price_of(names[role], prices) if names[role] != 'exact' else {'input': 0.0, 'output': 0.0}
        per_question[role] = (
            None
            if rates is None
            else (use['input_tokens'] * rates['input'] + use['output_tokens'] * rates['output']) / 1e6
        )
    known = [v for v in per_question.values() if v is not None]
    total = sum(known) if len(known) == len(per_question) else None
    return {
        'assumptions': {
            'questions': questions,
            'conversation_tokens_per_question': t,
            'messageTokens': message_tokens,
            'observationTokens': observation_tokens,
            'compression': compression,
            'observer_system_prompt_tokens': observer_system,
            'reflector_system_prompt_tokens': reflector_system,
            'thinking_tokens': thinking,
            'prompt_caching': 'none counted (an upper bound)',
        },
        'models': names,
        'tokens_per_question': {r: {k: round(v) for k, v in u.items()} for r, u in roles.items()},
        'cost_per_question': {r: (round(v, 4) if v is not None else None) for r, v in per_question.items()},
        'cost_per_question_total': round(total, 4) if total is not None else None,
        'cost_total': round(total * questions, 2) if total is not None else None,
        'prices_as_of': json.loads((ROOT / 'bench' / 'prices.json').read_text())['models']['as_of'],
    }


def cmd_estimate(args: argparse.Namespace) -> int:
    result = estimate(
        questions=args.questions,
        tokens_per_question=args.tokens_per_question,
        models={'observer': args.observer_model, 'reflector': args.reflector_model, 'actor': args.actor_model},
        judge=args.judge,
        message_tokens=args.message_tokens or 30_000,
        observation_tokens=args.observation_tokens or 40_000,
        compression=args.compression,
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    a = result['assumptions']
    print(
        f'{a["questions"]} questions x ~{a["conversation_tokens_per_question"]:,} conversation tokens; '
        f'thresholds {a["messageTokens"]:,}/{a["observationTokens"]:,}; observations {a["compression"]:g}x smaller '
        f'than the messages; no prompt caching (prices as of {result["prices_as_of"]})'
    )
    print(f'{"role":<10} {"model":<28} {"calls":>6} {"input":>10} {"output":>9} {"USD/question":>13}')
    for role, use in result['tokens_per_question'].items():
        cost = result['cost_per_question'][role]
        print(
            f'{role:<10} {result["models"][role]:<28} {use["calls"]:>6} {use["input_tokens"]:>10,} '
            f'{use["output_tokens"]:>9,} {(f"${cost:.4f}" if cost is not None else "no price"):>13}'
        )
    total = result['cost_per_question_total']
    if total is None:
        print('no total: a model has no price in bench/prices.json')
    else:
        print(f'per question ${total:.4f}; {a["questions"]} questions ${result["cost_total"]:,.2f}')
    return 0


# -- the command line ------------------------------------------------------------------------------------------------
def _models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--observer-model', default=REFERENCE_MODELS['observer'], help='default: %(default)s')
    parser.add_argument('--reflector-model', default=REFERENCE_MODELS['reflector'], help='default: %(default)s')
    parser.add_argument('--actor-model', default=REFERENCE_MODELS['actor'], help='default: %(default)s')
    parser.add_argument(
        '--judge', default=REFERENCE_JUDGE, help="a model (default: %(default)s, LongMemEval's) or 'exact' (no model)"
    )
    parser.add_argument('--message-tokens', type=int, help='observation threshold (default: the configuration’s)')
    parser.add_argument('--observation-tokens', type=int, help='reflection threshold (default: the configuration’s)')


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog='longmemeval', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = root.add_subparsers(dest='command', required=True)

    run = sub.add_parser('run', help='run questions and write the report')
    run.add_argument('data', help='longmemeval_s.json, longmemeval_m.json or longmemeval_oracle.json')
    run.add_argument('--out', default='longmemeval-results', help='results directory (default: %(default)s)')
    run.add_argument('--limit', type=int, help='the first N questions (after --types)')
    run.add_argument(
        '--types',
        type=lambda v: [t for t in v.split(',') if t],
        help=f'comma-separated question types: {", ".join((*lme_data.QUESTION_TYPES, lme_data.ABSTENTION))}',
    )
    run.add_argument('--parallel', type=int, default=4, help='questions at a time (default: %(default)s)')
    _models(run)
    run.add_argument('--scope', choices=('resource', 'thread'), default='resource', help='default: %(default)s')
    run.add_argument('--config', help='an OM configuration file (JSON); the model and threshold options win')
    run.add_argument(
        '--time-budget',
        type=float,
        default=20.0,
        help='seconds a request may spend on models, at most 28 (default: 20)',
    )
    run.add_argument('--settle-timeout', type=float, default=600.0, help='seconds to wait for background work')
    run.add_argument('--api-url', help='a deployed stack (its own models and configuration are used)')
    run.add_argument('--auth', choices=('none', 'iam', 'bearer'), default='iam', help='deployed stack auth')
    run.add_argument('--token-env', default='OM_API_TOKEN', help='where --auth bearer finds the token')
    run.add_argument('--keep-resources', action='store_true', help='keep each question’s memory (to inspect it)')
    run.set_defaults(func=cmd_run)

    rep = sub.add_parser('report', help='write the report of a run directory again')
    rep.add_argument('dir')
    rep.set_defaults(func=cmd_report)

    est = sub.add_parser('estimate', help='projected tokens and cost of a run (no model is called)')
    est.add_argument('--questions', type=int, default=500)
    est.add_argument('--tokens-per-question', type=int, default=115_000, help='longmemeval_s: ~115k (default)')
    est.add_argument('--compression', type=float, default=5.0, help='messages ÷ observations (default: %(default)s)')
    est.add_argument('--json', action='store_true')
    _models(est)
    est.set_defaults(func=cmd_estimate)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    raw = list(argv if argv is not None else sys.argv[1:])
    args.models_given = any(a.startswith(('--observer-model', '--reflector-model', '--actor-model')) for a in raw)
    try:
        return int(args.func(args))
    except (UsageError, lme_data.DatasetError, runner.ResumeError) as exc:
        print(f'longmemeval: {exc}', file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())

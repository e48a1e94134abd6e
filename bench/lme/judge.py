"""Grading an answer: LongMemEval's own judge prompts on a model, or an exact-match judge for offline runs.

The prompts are LongMemEval's published per-type templates (`judge_prompts.json`, with their source): one for
single-session-user / single-session-assistant / multi-session, one each for temporal-reasoning (off-by-one days
forgiven), knowledge-update (an older value beside the updated one is fine) and single-session-preference (a rubric),
and one for abstention questions (`_abs` in the id, whatever their type). The judge's answer counts as correct when it
contains "yes", as in the published script (temperature 0, at most 10 output tokens; the reference judge is gpt-4o).

`ExactJudge` needs no model: correct when the expected answer's words appear in the reply, in order (case and
punctuation aside); for an abstention question, when the reply says it does not know. It is for the offline proof
and smoke runs only; its figures are not comparable with published ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

PROMPTS_FILE = Path(__file__).with_name('judge_prompts.json')
JUDGE_MAX_OUTPUT_TOKENS = 10


@cache
def prompt_data() -> dict[str, Any]:
    """The published templates (`judge_prompts.json`)."""
    return json.loads(PROMPTS_FILE.read_text(encoding='utf-8'))


def template_name(question_type: str, *, abstention: bool) -> str:
    """Which published template grades a question: `abstention` for `_abs` questions, else its type's."""
    data = prompt_data()
    if abstention:
        return str(data['abstention_template'])
    try:
        return str(data['template_by_type'][question_type])
    except KeyError:
        raise ValueError(f'no judge prompt for question type {question_type!r}') from None


def judge_prompt(question_type: str, question: str, answer: str, response: str, *, abstention: bool) -> str:
    """The judge's whole prompt for one answer, as LongMemEval builds it."""
    template = prompt_data()['templates'][template_name(question_type, abstention=abstention)]
    return str(template).format(question=question, answer=answer, response=response)


@dataclass(frozen=True)
class Verdict:
    """A grade: correct or not, how it was reached, and what the judge's model used."""

    correct: bool
    judge: str
    template: str
    raw: str
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)


class Judge(Protocol):
    name: str

    def grade(self, question_type: str, question: str, answer: str, response: str, *, abstention: bool) -> Verdict:
        """Grade one reply."""
        ...


# -- exact match -----------------------------------------------------------------------------------------------------
_WORD = re.compile(r'[a-z0-9]+')
_DONT_KNOW = re.compile(
    r"\b(?:i (?:do not|don't|dont) (?:know|have|remember|recall|see)|no (?:information|record|mention)|"
    r'not (?:mentioned|stated|available|in (?:my|the) (?:memory|notes|conversation))|'
    r"(?:haven't|have not|never) (?:mentioned|told|said)|(?:cannot|can't|could not|couldn't) find|"
    r'nothing (?:in|about)|unknown|not sure)\b',
    re.I,
)


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def contains_in_order(response: str, answer: str) -> bool:
    """The answer's words appear in the response as one run (case and punctuation aside)."""
    wanted, said = _words(answer), _words(response)
    if not wanted:
        return False
    n = len(wanted)
    return any(said[i : i + n] == wanted for i in range(len(said) - n + 1))


class ExactJudge:
    """Exact match: no model, free, deterministic; not LongMemEval's judge."""

    name = 'exact'

    def grade(self, question_type: str, question: str, answer: str, response: str, *, abstention: bool) -> Verdict:
        template = template_name(question_type, abstention=abstention)
        if abstention:
            correct = _DONT_KNOW.search(response) is not None
        else:
            correct = contains_in_order(response, answer)
        return Verdict(correct, self.name, template, 'match' if correct else 'no match')


# -- a model ---------------------------------------------------------------------------------------------------------
class ModelJudge:
    """LongMemEval's judge prompts on a model (`openai/gpt-4o` is the published setting), through this project's model
    adapters and router (its retries and backoff)."""

    def __init__(self, model: str, providers: dict[str, Any], *, deadline_s: float = 120.0) -> None:
        from om_lib.clock import SystemClock
        from om_lib.models.model_router import ModelRouter
        from om_lib.models.model_spec import ModelRef

        self.name = model
        self._ref = ModelRef.parse(model)
        if self._ref.provider not in providers:
            raise ValueError(f'unknown provider in judge model {model!r}: use google/…, bedrock/…, openai/… or offline')
        self._clock = SystemClock()
        self._router = ModelRouter(providers, clock=self._clock, default_max_retries=6)
        self._deadline_s = deadline_s

    def grade(self, question_type: str, question: str, answer: str, response: str, *, abstention: bool) -> Verdict:
        from om_lib.llm import Content, ModelRequest

        template = template_name(question_type, abstention=abstention)
        prompt = judge_prompt(question_type, question, answer, response, abstention=abstention)
        request = ModelRequest(
            purpose='actor',
            system='',
            contents=(Content(role='user', parts=(prompt,)),),
            temperature=0.0,
            max_output_tokens=JUDGE_MAX_OUTPUT_TOKENS,
        )
        reply = self._router.generate(
            self._ref, request, input_tokens=len(prompt) // 4, deadline=self._clock.monotonic() + self._deadline_s
        )
        usage = {
            'calls': 1,
            'input_tokens': reply.usage.input_tokens,
            'output_tokens': reply.usage.output_tokens,
            'cache_read_tokens': reply.usage.cache_read_tokens,
        }
        return Verdict('yes' in reply.text.lower(), self.name, template, reply.text.strip(), {self.name: usage})


def make_judge(name: str, providers: dict[str, Any] | None) -> Judge:
    """`exact`, or a model name (`openai/gpt-4o`, `google/gemini-2.5-flash`, `bedrock/…`, `offline`)."""
    if name == 'exact':
        return ExactJudge()
    if providers is None:
        raise ValueError('a model judge needs the model providers')
    return ModelJudge(name, providers)

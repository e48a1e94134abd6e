"""The run's report: accuracy overall and per question type, tokens and cost per question, the published figures beside
ours, and a plot (report.md, report.json, accuracy_by_type.png in the run's directory).

Accuracy is reported three ways, as LongMemEval's `print_qa_metrics.py` does: overall (every graded question counts
once), task-averaged (the mean of the six types' accuracies) and abstention (the `_abs` questions, which also count in
their own type).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.lme.data import ABSTENTION, QUESTION_TYPES, category_of
from bench.lme.usage import ROLES, add_usage, empty_usage

PUBLISHED_FILE = Path(__file__).with_name('published.json')
CATEGORIES = (*QUESTION_TYPES, ABSTENTION)
SHORT = {
    'single-session-user': 'SS-user',
    'single-session-assistant': 'SS-assistant',
    'single-session-preference': 'SS-preference',
    'multi-session': 'multi-session',
    'knowledge-update': 'knowledge-update',
    'temporal-reasoning': 'temporal',
    ABSTENTION: 'abstention',
    'overall': 'overall',
}


def published() -> list[dict[str, Any]]:
    """The published figures (`published.json`): system, reader, judge, date, source, overall, per type."""
    return list(json.loads(PUBLISHED_FILE.read_text(encoding='utf-8'))['figures'])


def _pct(correct: int, total: int) -> float | None:
    return round(100.0 * correct / total, 2) if total else None


def summarize(results: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> dict[str, Any]:
    """Accuracy, tokens and cost of the graded results (the last record of each question)."""
    graded = [r for r in results if r.get('correct') is not None]
    failed = [r for r in results if r.get('correct') is None]
    per: dict[str, dict[str, int]] = {c: {'correct': 0, 'total': 0} for c in CATEGORIES}
    for r in graded:
        for category in category_of(r['question_type'], r['question_id']):
            per[category]['total'] += 1
            per[category]['correct'] += bool(r['correct'])
    by_type = {
        c: {**counts, 'accuracy': _pct(counts['correct'], counts['total'])}
        for c, counts in per.items()
        if counts['total']
    }
    type_accuracies = [by_type[t]['accuracy'] for t in QUESTION_TYPES if t in by_type]
    correct = sum(bool(r['correct']) for r in graded)
    usage: dict[str, dict[str, int]] = {}
    cost: dict[str, float] = {}
    cost_known = True
    for r in graded:
        for role, models in (r.get('usage') or {}).items():
            for model_usage in models.values():
                add_usage(usage.setdefault(role, empty_usage()), model_usage)
        for role, value in (r.get('cost_usd') or {}).items():
            if value is None:
                cost_known = False
            else:
                cost[role] = cost.get(role, 0.0) + float(value)
    n = len(graded)
    return {
        'run': dict(run),
        'questions': n,
        'not_graded': [{'question_id': r['question_id'], 'error': r.get('error')} for r in failed],
        'accuracy': {
            'overall': _pct(correct, n),
            'task_averaged': round(sum(type_accuracies) / len(type_accuracies), 2) if type_accuracies else None,
            'abstention': by_type.get(ABSTENTION, {}).get('accuracy'),
            'by_type': by_type,
        },
        'tokens_per_question': {
            role: {k: round(v / n, 1) for k, v in u.items()} for role, u in sorted(usage.items(), key=_role_order)
        }
        if n
        else {},
        'cost_usd': {
            'per_question': {role: round(v / n, 5) for role, v in sorted(cost.items(), key=_role_order)} if n else {},
            'per_question_total': round(sum(cost.values()) / n, 5) if n and cost else None,
            'total': round(sum(cost.values()), 4) if cost else None,
            'complete': cost_known,
            'unpriced_models': sorted({m for r in graded for m in r.get('unpriced_models') or []}),
        },
        'seconds_per_question': round(sum(float(r.get('seconds') or 0) for r in graded) / n, 1) if n else None,
        'memory': {
            'observed': sum(1 for r in graded if (r.get('memory') or {}).get('observationTokens')),
            'reflected': sum(1 for r in graded if (r.get('memory') or {}).get('generationCount')),
        },
    }


def _role_order(item: tuple[str, Any]) -> int:
    return ROLES.index(item[0]) if item[0] in ROLES else len(ROLES)


def comparable(run: Mapping[str, Any], *, short: bool = False) -> str | None:
    """Why these figures cannot be set beside the published ones, or None."""
    reasons = []
    if run.get('judge') == 'exact':
        reasons.append('exact-match judge' if short else "graded by exact match, not by LongMemEval's judge prompts")
    models = run.get('models') or {}
    offline = sorted(role for role, name in models.items() if str(name).split('/')[0] == 'offline')
    if offline:
        reasons.append('offline models' if short else f'the offline model played {", ".join(offline)}')
    if str(run.get('judge', '')).split('/')[0] == 'offline':
        reasons.append('offline judge' if short else 'the offline model was the judge')
    return '; '.join(reasons) or None


def render_markdown(summary: Mapping[str, Any], plot: str | None) -> str:
    """report.md."""
    run = summary['run']
    acc = summary['accuracy']
    lines = [
        '# LongMemEval report',
        '',
        f'- Data: `{run.get("dataset")}` ({summary["questions"]} graded questions'
        + (f', {len(summary["not_graded"])} not graded' if summary['not_graded'] else '')
        + ')',
        f'- Stack: {run.get("stack")}; scope `{run.get("scope")}`; thresholds {run.get("thresholds")}',
        f'- Models: {", ".join(f"{role} `{name}`" for role, name in (run.get("models") or {}).items())}',
        f'- Judge: `{run.get("judge")}`',
        f'- Run started {run.get("started")}',
        '',
    ]
    why = comparable(run)
    if why:
        lines += [
            f'> **Not comparable with published figures:** {why}. These numbers show that the harness runs end to '
            'end; they say nothing about memory quality.',
            '',
        ]
    lines += [
        '## Accuracy',
        '',
        '| | correct | questions | accuracy |',
        '|---|---:|---:|---:|',
    ]
    for category, counts in acc['by_type'].items():
        lines.append(f'| {category} | {counts["correct"]} | {counts["total"]} | {_fmt(counts["accuracy"])} |')
    lines += [
        f'| **overall** (every question once) | | {summary["questions"]} | **{_fmt(acc["overall"])}** |',
        f'| task-averaged (mean of the types) | | | {_fmt(acc["task_averaged"])} |',
        '',
        '## Tokens and cost per question',
        '',
        '| role | calls | input tokens | output tokens | cached input | cost (USD) |',
        '|---|---:|---:|---:|---:|---:|',
    ]
    costs = summary['cost_usd']['per_question']
    for role, u in summary['tokens_per_question'].items():
        lines.append(
            f'| {role} | {u["calls"]:g} | {u["input_tokens"]:,.0f} | {u["output_tokens"]:,.0f} | '
            f'{u["cache_read_tokens"]:,.0f} | {_money(costs.get(role))} |'
        )
    cost = summary['cost_usd']
    lines += [
        '',
        f'Per question: {_money(cost["per_question_total"])}; the whole run: {_money(cost["total"])}'
        + ('' if cost['complete'] else f' (incomplete: no price for {", ".join(cost["unpriced_models"])})')
        + f'. Mean time per question: {summary["seconds_per_question"]} s.',
    ]
    if run.get('stack') == 'deployed':
        lines.append(
            "A deployed stack does not report its models' usage to clients: only the judge is counted here; see "
            "your providers' billing for the rest."
        )
    lines += [
        '',
        f'Memory: {summary["memory"]["observed"]} questions observed, {summary["memory"]["reflected"]} reflected.',
        '',
        '## Published figures',
        '',
        '| system | data | reader | memory models | judge | overall | date | source |',
        '|---|---|---|---|---|---:|---|---|',
    ]
    for fig in published():
        lines.append(
            f'| {fig["system"]} | {fig["dataset"]} | {fig["reader"]} | {fig["memory_models"]} | {fig["judge"]} | '
            f'{fig["overall"]:.2f}% | {fig["date"]} | {fig["source"]} |'
        )
    lines += [
        f'| **this run** | {Path(str(run.get("dataset"))).name} | {(run.get("models") or {}).get("actor", "?")} | '
        f'{_memory_models(run)} | {run.get("judge")} | {_fmt(acc["overall"])} | {str(run.get("started"))[:10]} | '
        'this report |',
        '',
    ]
    if plot:
        lines += [f'![accuracy per question type]({plot})', '']
    if summary['not_graded']:
        lines += ['## Not graded (rerun to retry them)', '']
        lines += [f'- `{item["question_id"]}`: {item["error"]}' for item in summary['not_graded']]
        lines.append('')
    return '\n'.join(lines)


def _memory_models(run: Mapping[str, Any]) -> str:
    models = run.get('models') or {}
    return f'Observer {models.get("observer", "?")}, Reflector {models.get("reflector", "?")}'


def _fmt(value: float | None) -> str:
    return f'{value:.2f}%' if value is not None else 'n/a'


def _money(value: float | None) -> str:
    return f'${value:,.4f}' if value is not None else 'n/a'


def plot(summary: Mapping[str, Any], path: Path) -> Path:
    """accuracy_by_type.png: our accuracy per type beside every published figure that has it."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    acc = summary['accuracy']
    categories = [c for c in CATEGORIES if c in acc['by_type']] + ['overall']
    ours = [acc['by_type'][c]['accuracy'] if c != 'overall' else acc['overall'] for c in categories]
    series: list[tuple[str, list[float | None]]] = [('this run', ours)]
    for fig in published():
        values = [fig.get('per_type', {}).get(c) if c != 'overall' else fig['overall'] for c in categories]
        label = f'{fig["system"]} ({fig["reader"]}, {fig["date"][:7]})'
        series.append((label, values))
    colors = ['black', *(plt.get_cmap('tab10')(i) for i in range(len(series) - 1))]
    fig_, ax = plt.subplots(figsize=(max(9.0, 1.5 * len(categories)), 5.5))
    labelled: set[int] = set()
    for x in range(len(categories)):
        # Each group shows the series that have a figure for it, side by side.
        present = [(i, values[x]) for i, (_, values) in enumerate(series) if values[x] is not None]
        width = 0.8 / max(1, len(present))
        for slot, (i, value) in enumerate(present):
            position = x + (slot - (len(present) - 1) / 2) * width
            assert value is not None
            ax.bar(position, value, width, color=colors[i], label=series[i][0] if i not in labelled else None)
            labelled.add(i)
            if i == 0:
                ax.annotate(f'{value:.0f}', (position, value), ha='center', va='bottom', fontsize=7)
    ax.set_xticks(range(len(categories)), [SHORT[c] for c in categories], rotation=20, ha='right')
    ax.set_ylim(0, 100)
    ax.set_ylabel('accuracy (%)')
    why = comparable(summary['run'], short=True)
    title = f'LongMemEval: {Path(str(summary["run"].get("dataset"))).name}, {summary["questions"]} questions'
    ax.set_title(title + ('\n(not comparable: ' + why + ')' if why else ''), fontsize=10)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis='y', alpha=0.3)
    fig_.tight_layout()
    fig_.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig_)
    return path


def write_report(out_dir: Path, results: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> dict[str, Any]:
    """report.json, accuracy_by_type.png and report.md in `out_dir`; the summary."""
    summary = summarize(results, run)
    (out_dir / 'report.json').write_text(json.dumps(summary, indent=2) + '\n')
    picture = plot(summary, out_dir / 'accuracy_by_type.png').name if summary['questions'] else None
    (out_dir / 'report.md').write_text(render_markdown(summary, picture))
    return summary


def console_summary(summary: Mapping[str, Any]) -> str:
    """A few lines for the terminal."""
    acc = summary['accuracy']
    lines = [
        f'{summary["questions"]} questions graded: overall {_fmt(acc["overall"])}, task-averaged '
        f'{_fmt(acc["task_averaged"])}, abstention {_fmt(acc["abstention"])}'
    ]
    lines += [f'  {c:<26} {v["correct"]:>4}/{v["total"]:<4} {_fmt(v["accuracy"])}' for c, v in acc['by_type'].items()]
    cost = summary['cost_usd']
    lines.append(f'  cost per question {_money(cost["per_question_total"])}, run {_money(cost["total"])}')
    why = comparable(summary['run'])
    if why:
        lines.append(f'  NOT COMPARABLE with published figures: {why}.')
    return '\n'.join(lines)

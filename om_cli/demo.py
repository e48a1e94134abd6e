"""`om demo`: replays a bundled multi-session conversation and shows the memory over time."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from typing import Any

from om_cli.wiring import build_engine
from om_lib.adapters.memory_store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.messages import Message

# Small thresholds so a short conversation shows observation and reflection happening.
DEMO_CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 400, 'bufferTokens': False},
    'reflection': {'observationTokens': 500},
}


@dataclass
class DemoRow:
    """One step of the demo as shown in the table."""

    step: int
    session: int
    window_tokens: int
    observation_tokens: int
    generation: int
    events: str


def load_conversation() -> dict[str, Any]:
    """The bundled conversation (four sessions over a month)."""
    text = resources.files('om_cli').joinpath('data/demo_conversation.json').read_text(encoding='utf-8')
    return json.loads(text)


def run_demo(*, config: dict[str, Any] | None = None, quiet: bool = False) -> list[DemoRow]:
    """Replay the conversation through the engine; print a table and the final memory unless `quiet`."""
    conversation = load_conversation()
    resource_id, thread_id = conversation['resourceId'], conversation['threadId']
    clock = ManualClock()
    engine = build_engine(OMConfig.model_validate(config or DEMO_CONFIG), store=InMemoryStore(), clock=clock)
    rows: list[DemoRow] = []
    step = 0
    for session_index, session in enumerate(conversation['sessions'], start=1):
        clock.set(datetime.fromisoformat(session['date'].replace('Z', '+00:00')))
        for user_text, assistant_text in session['turns']:
            step += 1
            user = Message(
                id=f'u{step}', role='user', created_at=clock.now(), parts=({'type': 'text', 'text': user_text},)
            )  # type: ignore[arg-type]
            result = engine.prepare_step(resource_id, thread_id, [user])
            status = next(p for p in result.parts if p['type'] == 'data-om-status')['data']
            events = [
                f'{p["data"]["operationType"]}:{p["type"].removeprefix("data-om-observation-")}'
                for p in result.parts
                if p['type'].startswith('data-om-observation-')
            ]
            rows.append(
                DemoRow(
                    step=step,
                    session=session_index,
                    window_tokens=status['windows']['active']['messages']['tokens'],
                    observation_tokens=status['windows']['active']['observations']['tokens'],
                    generation=status['generationCount'],
                    events=', '.join(events),
                )
            )
            clock.advance(timedelta(minutes=1))
            reply = Message(
                id=f'a{step}',
                role='assistant',
                created_at=clock.now(),
                parts=({'type': 'text', 'text': assistant_text},),
            )  # type: ignore[arg-type]
            engine.complete_turn(resource_id, thread_id, [reply])
            clock.advance(timedelta(minutes=2))
    if not quiet:
        _print_table(rows)
        record = engine.store.get_record(f'thread:{resource_id}/{thread_id}')
        if record is not None:
            print(f'\nFinal observations (generation {record.generation}, {record.observation_tokens} tokens):\n')
            print(record.active_observations)
    return rows


def _message(mid: str, role: str, text: str, at: datetime) -> Message:
    return Message.model_validate({'id': mid, 'role': role, 'createdAt': at.isoformat(), 'content': text})


def _print_table(rows: list[DemoRow]) -> None:
    header = f'{"step":>4} {"session":>7} {"window tok":>10} {"obs tok":>8} {"gen":>3}  events'
    print(header)
    print('-' * len(header))
    for row in rows:
        counts = f'{row.window_tokens:>10} {row.observation_tokens:>8} {row.generation:>3}'
        print(f'{row.step:>4} {row.session:>7} {counts}  {row.events}')

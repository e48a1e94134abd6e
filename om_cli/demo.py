"""`om demo`: replays a bundled multi-session conversation through the HTTP API of an embedded local stack.

Every step goes through the same path a client's does: `POST /threads/{t}/steps` with the user's message, then
`POST /threads/{t}/turns` with the bundled assistant reply. Observation happens inside a step whose unobserved
messages pass `messageTokens`, or in the buffer worker when a turn pushes them past it (the turn queues the job);
reflection runs in the background (the Step Functions workflow on moto, its tasks in this process). The demo waits
for background work after each turn, so the table shows where each observation and generation happened. At the end
it prints the final memory and writes a PNG plot of the message window and the observations per step (a small
pure-Python PNG writer: no plotting library needed).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from om_cli.wiring import http_json

# Small thresholds so a short conversation shows observation (three times) and reflection (once) happening.
DEMO_CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 300, 'bufferTokens': False},
    'reflection': {'observationTokens': 900},
}


@dataclass
class DemoRow:
    """One step of the demo as shown in the table and the plot."""

    step: int
    session: int
    window_tokens: int
    observation_tokens: int
    generation: int
    events: list[str] = field(default_factory=list)


def load_conversation() -> dict[str, Any]:
    """The bundled conversation (four sessions over a month)."""
    text = resources.files('om_cli').joinpath('data/demo_conversation.json').read_text(encoding='utf-8')
    return json.loads(text)  # type: ignore[no-any-return]


def run_demo(
    *, config: dict[str, Any] | None = None, out: str | None = 'om-demo.png', quiet: bool = False
) -> list[DemoRow]:
    """Replay the conversation through the local stack's HTTP API; print a table, the memory and write the plot."""
    from om_cli.local_stack import LocalStack
    from om_cli.wiring import QUIET_FUNCTIONS, model_notice

    started = time.monotonic()
    conversation = load_conversation()
    resource_id, thread_id = conversation['resourceId'], conversation['threadId']
    say = (lambda *a: None) if quiet else print
    say('starting the local stack (embedded AWS, functions in-process) ...')
    settings = config or DEMO_CONFIG
    with LocalStack(port=0, config=settings, sweep_interval_s=None, env=QUIET_FUNCTIONS) as stack:
        say(f'API at {stack.url}; {model_notice()}')
        for line in settings_lines(settings):
            say(line)
        say()
        api = stack.url
        base = f'/threads/{thread_id}'
        rows: list[DemoRow] = []
        generation = 0
        step = 0
        for session_index, session in enumerate(conversation['sessions'], start=1):
            at = datetime.fromisoformat(session['date'].replace('Z', '+00:00'))
            for user_text, assistant_text in session['turns']:
                step += 1
                user = {'id': f'u{step}', 'role': 'user', 'createdAt': at.isoformat(), 'content': user_text}
                sent_at = datetime.now(UTC)
                status, body = http_json(
                    api, 'POST', f'{base}/steps', {'resourceId': resource_id, 'messages': [user], 'stepNumber': step}
                )
                _check(status, body, 'steps')
                row = _row(step, session_index, body['parts'], since=sent_at)
                reply_at = at + timedelta(minutes=1)
                reply = {'id': f'a{step}', 'role': 'assistant', 'createdAt': reply_at.isoformat()}
                reply['content'] = assistant_text
                status, body = http_json(api, 'POST', f'{base}/turns', {'resourceId': resource_id, 'messages': [reply]})
                _check(status, body, 'turns')
                # Background work (a reflection workflow, a deferred observation) finishes before the next step.
                stack.drain(timeout=60, interval=0.05)
                status, memory = http_json(api, 'GET', f'{base}/memory?resourceId={resource_id}')
                _check(status, memory, 'memory')
                if memory['generationCount'] > generation:
                    # Reflected in the step (its parts say so) or afterwards by the workflow the turn started.
                    where = '' if 'reflection:end' in row.events else 'reflection:workflow '
                    row.events.append(f'{where}(gen {memory["generationCount"]})')
                    generation = memory['generationCount']
                elif memory['observationTokens'] != row.observation_tokens and not row.events:
                    row.events.append('observation:worker')
                rows.append(row)
                at += timedelta(minutes=3)
        status, memory = http_json(api, 'GET', f'{base}/memory?resourceId={resource_id}')
        _check(status, memory, 'memory')
    if not quiet:
        _print_table(rows)
        print(
            f'\nFinal observations (generation {memory["generationCount"]}, {memory["observationTokens"]} tokens, '
            f'{memory["pendingMessageTokens"]} tokens not yet observed):\n'
        )
        print(memory.get('observations') or '(none)')
    if out:
        limits = memory.get('thresholds') or {}
        thresholds = (int(limits.get('messageTokens') or 0), int(limits.get('observationTokens') or 0))
        Path(out).write_bytes(plot_png(rows, thresholds=thresholds if all(thresholds) else None))
        say(f'\nplot written to {out}')
    say(f'demo finished in {time.monotonic() - started:.1f} s')
    return rows


def settings_lines(config: dict[str, Any]) -> list[str]:
    """What the demo runs with, in words (the thresholds decide when observation and reflection happen)."""
    from om_cli.wiring import has_model_credentials
    from om_lib.config import OMConfig

    s = OMConfig.model_validate(config).resolved()
    buffering = f'every {s.buffer_tokens} tokens in the background' if s.buffer_tokens else 'off (synchronous)'
    return [
        'settings:',
        f'  observation.messageTokens   {s.max_message_threshold():>6}  observe once unobserved messages pass this',
        f'  reflection.observationTokens {s.observation_tokens:>5}  reflect once the observations pass this',
        f'  async buffering             {buffering}',
        f'  scope {s.scope}; Observer {s.observer_model}, Reflector {s.reflector_model}'
        + ('' if has_model_credentials(os.environ) else ' (the offline model stands in for both: no GEMINI_API_KEY)'),
    ]


def _check(status: int, body: Any, what: str) -> None:
    if status != 200:
        print(f'{what} answered {status}: {json.dumps(body)}', file=sys.stderr)
        raise SystemExit(1)


def _row(step: int, session: int, parts: list[dict[str, Any]], *, since: datetime) -> DemoRow:
    status = next(p for p in parts if p['type'] == 'data-om-status')['data']
    active = status['windows']['active']
    # A step also answers what background work did before it (kept on the record): the table shows that work at the
    # step whose turn started it, so only this step's own cycles count here.
    events = [
        f'{p["data"]["operationType"]}:{p["type"].removeprefix("data-om-observation-")}'
        for p in parts
        if p['type'].startswith('data-om-observation-') and _at(p['data']) >= since
    ]
    return DemoRow(
        step=step,
        session=session,
        window_tokens=active['messages']['tokens'],
        observation_tokens=active['observations']['tokens'],
        generation=status['generationCount'],
        events=events,
    )


def _at(data: dict[str, Any]) -> datetime:
    stamp = data.get('startedAt') or data.get('completedAt') or data.get('failedAt')
    return datetime.fromisoformat(str(stamp).replace('Z', '+00:00')) if stamp else datetime.max.replace(tzinfo=UTC)


def _print_table(rows: list[DemoRow]) -> None:
    header = f'{"step":>4} {"session":>7} {"window tok":>10} {"obs tok":>8} {"gen":>3}  events'
    print(header)
    print('-' * len(header))
    for row in rows:
        counts = f'{row.window_tokens:>10} {row.observation_tokens:>8} {row.generation:>3}'
        print(f'{row.step:>4} {row.session:>7} {counts}  {", ".join(row.events)}')


# ---------------------------------------------------------------------------------------------------------------------
# A tiny PNG line plot (no plotting library in the runtime dependencies)
# ---------------------------------------------------------------------------------------------------------------------
Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (40, 40, 40)
GRID: Color = (225, 225, 225)
BLUE: Color = (31, 119, 180)
ORANGE: Color = (230, 120, 20)
GREEN: Color = (44, 160, 44)

# 3x5 glyphs: five rows of three pixels, top to bottom ('#' = ink).
_FONT: dict[str, str] = {
    'A': '.#. #.# ### #.# #.#',
    'B': '##. #.# ##. #.# ##.',
    'C': '.## #.. #.. #.. .##',
    'D': '##. #.# #.# #.# ##.',
    'E': '### #.. ##. #.. ###',
    'F': '### #.. ##. #.. #..',
    'G': '.## #.. #.# #.# .##',
    'H': '#.# #.# ### #.# #.#',
    'I': '### .#. .#. .#. ###',
    'J': '..# ..# ..# #.# .#.',
    'K': '#.# #.# ##. #.# #.#',
    'L': '#.. #.. #.. #.. ###',
    'M': '#.# ### ### #.# #.#',
    'N': '##. #.# #.# #.# #.#',
    'O': '.#. #.# #.# #.# .#.',
    'P': '##. #.# ##. #.. #..',
    'Q': '.#. #.# #.# ##. .##',
    'R': '##. #.# ##. #.# #.#',
    'S': '.## #.. .#. ..# ##.',
    'T': '### .#. .#. .#. .#.',
    'U': '#.# #.# #.# #.# ###',
    'V': '#.# #.# #.# #.# .#.',
    'W': '#.# #.# ### ### #.#',
    'X': '#.# #.# .#. #.# #.#',
    'Y': '#.# #.# .#. .#. .#.',
    'Z': '### ..# .#. #.. ###',
    '0': '### #.# #.# #.# ###',
    '1': '.#. ##. .#. .#. ###',
    '2': '##. ..# .#. #.. ###',
    '3': '##. ..# .#. ..# ##.',
    '4': '#.# #.# ### ..# ..#',
    '5': '### #.. ##. ..# ##.',
    '6': '.## #.. ### #.# ###',
    '7': '### ..# .#. .#. .#.',
    '8': '### #.# ### #.# ###',
    '9': '### #.# ### ..# ##.',
    ' ': '... ... ... ... ...',
    ':': '... .#. ... .#. ...',
    '-': '... ... ### ... ...',
    '.': '... ... ... ... .#.',
    '/': '..# ..# .#. #.. #..',
    '(': '.#. #.. #.. #.. .#.',
    ')': '.#. ..# ..# ..# .#.',
}


class Canvas:
    """An RGB raster with just enough drawing for a line chart."""

    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        for y in range(min(y0, y1), max(y0, y1) + 1):
            for x in range(min(x0, x1), max(x0, x1) + 1):
                self.set(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, width: int = 1, dash: int = 0) -> None:
        """Bresenham, thickened by stamping a square; `dash` > 0 draws dashes of that many pixels."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, n = dx + dy, 0
        half = width // 2
        while True:
            if not dash or (n // dash) % 2 == 0:
                self.rect(x0 - half, y0 - half, x0 - half + width - 1, y0 - half + width - 1, color)
            if x0 == x1 and y0 == y1:
                return
            n += 1
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> None:
        for char in text.upper():
            for row, bits in enumerate(_FONT.get(char, _FONT[' ']).split()):
                for col, bit in enumerate(bits):
                    if bit == '#':
                        self.rect(
                            x + col * scale,
                            y + row * scale,
                            x + col * scale + scale - 1,
                            y + row * scale + scale - 1,
                            color,
                        )
            x += 4 * scale

    def png(self) -> bytes:
        raw = b''.join(
            b'\x00' + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack('>IIBBBBB', self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (
            b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(raw, 9)) + chunk(b'IEND', b'')
        )


def _nice_ceiling(value: int) -> int:
    for step in (100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000):
        if value <= step * 5:
            return step * 5
    return ((value // 10000) + 1) * 10000


def plot_png(
    rows: list[DemoRow], *, thresholds: tuple[int, int] | None = None, width: int = 900, height: int = 420
) -> bytes:
    """Message-window and observation tokens per step, reflections and (dashed) thresholds marked; PNG bytes."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 70, width - 20, 50, height - 45
    peak = max([1, *(max(r.window_tokens, r.observation_tokens) for r in rows), *(thresholds or ())])
    y_max = _nice_ceiling(peak)
    steps = max(1, len(rows) - 1)

    def px(i: int) -> int:
        return left + round(i * (right - left) / steps)

    def py(v: int) -> int:
        return bottom - round(v * (bottom - top) / y_max)

    for k in range(6):
        value = y_max * k // 5
        canvas.line(left, py(value), right, py(value), GRID)
        label = str(value)
        canvas.text(left - 8 - len(label) * 8, py(value) - 5, label)
    canvas.line(left, top, left, bottom, BLACK)
    canvas.line(left, bottom, right, bottom, BLACK)
    for i, row in enumerate(rows):
        canvas.line(px(i), bottom, px(i), bottom + 4, BLACK)
        if len(rows) <= 30 or i % 2 == 0:
            canvas.text(px(i) - len(str(row.step)) * 4, bottom + 9, str(row.step))
        if any(event.startswith('reflection') for event in row.events):
            canvas.line(px(i), top, px(i), bottom, GREEN, dash=4)
    names = ('OBSERVE AT', 'REFLECT AT')
    for threshold, color, name in zip(thresholds or (), (BLUE, ORANGE), names, strict=False):
        canvas.line(left, py(threshold), right, py(threshold), color, dash=6)
        label = f'{name} {threshold}'
        canvas.text(left + 8, py(threshold) - 14, label, color)
    for values, color in (([r.window_tokens for r in rows], BLUE), ([r.observation_tokens for r in rows], ORANGE)):
        for i in range(1, len(values)):
            canvas.line(px(i - 1), py(values[i - 1]), px(i), py(values[i]), color, width=3)
        for i, value in enumerate(values):
            canvas.rect(px(i) - 3, py(value) - 3, px(i) + 3, py(value) + 3, color)
    canvas.text(left, 14, 'OBSERVATIONAL MEMORY DEMO: TOKENS PER STEP', scale=3)
    legend = ((BLUE, 'MESSAGE WINDOW'), (ORANGE, 'OBSERVATIONS'), (GREEN, 'REFLECTION'))
    x = right - 420
    for color, label in legend:
        canvas.rect(x, top - 14, x + 14, top - 4, color)
        canvas.text(x + 20, top - 14, label)
        x += 30 + len(label) * 8
    canvas.text((left + right) // 2 - 60, height - 16, 'STEP (ONE USER TURN)')
    canvas.text(8, top - 30, 'TOKENS')
    return canvas.png()

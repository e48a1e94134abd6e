"""Entry point of the `om` command: serve, invoke, chat and demo, all on the local stack (om_cli/local_stack.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from om_cli.wiring import QUIET_FUNCTIONS, http_json, model_notice

FUNCTIONS = ('api', 'buffer_worker', 'reflection', 'sweeper')


def cmd_serve(args: argparse.Namespace) -> int:
    """`om serve`: the HTTP API with background work, until Ctrl-C."""
    import signal
    import threading

    from om_cli.local_stack import LocalStack

    stack = LocalStack(
        host=args.host, port=args.port, config_file=args.config, sweep_interval_s=args.sweep_interval
    ).start()
    aws = 'embedded moto server' if stack.embedded else 'AWS_ENDPOINT_URL'
    print(f'om serve: {stack.url}  (AWS: {aws} at {stack.endpoint})', flush=True)
    print(model_notice(), flush=True)
    print(f'try: curl {stack.url}/health', flush=True)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())  # `kill` stops it as cleanly as Ctrl-C
    try:
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        print('stopping ...', file=sys.stderr)
        stack.stop()
    return 0


def cmd_invoke(args: argparse.Namespace) -> int:
    """`om invoke <function> <event.json>`: one handler, on the same stack settings as `om serve`."""
    from om_cli.local_stack import LocalStack, invoke_handler

    if args.function not in FUNCTIONS:
        print(f'unknown function {args.function!r}; one of {", ".join(FUNCTIONS)}', file=sys.stderr)
        return 2
    event = json.loads(Path(args.event).read_text(encoding='utf-8'))
    with LocalStack(config_file=args.config, http=False, workers=False):
        answer = invoke_handler(args.function, event)
    print(json.dumps(answer, indent=2, ensure_ascii=False, default=str))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """`om chat`: a REPL against a running `om serve` (--url) or an embedded one."""
    from om_cli.local_stack import LocalStack

    stack = None
    url = args.url
    if not url:
        # The functions' logs would interleave with the conversation; `om serve` shows them.
        stack = LocalStack(port=0, config_file=args.config, env=QUIET_FUNCTIONS).start()
        url = stack.url
        print(f'(embedded local stack at {url}; {model_notice()})')
    try:
        print(f'chatting as resource {args.resource!r} in thread {args.thread!r}; Ctrl-D or /quit to leave')
        while True:
            try:
                text = input('you> ').strip()
            except EOFError:
                print()
                break
            if text in ('/quit', '/exit'):
                break
            if not text:
                continue
            status, body = http_json(
                url, 'POST', f'/threads/{args.thread}/chat', {'resourceId': args.resource, 'content': text}
            )
            if status != 200:
                print(f'[{status}] {body.get("error", body)}')
                continue
            reply = body.get('reply') or {}
            print(f'assistant> {message_text(reply) or "(no reply: " + failed_reason(body.get("parts") or []) + ")"}')
            print(f'  {status_line(body.get("parts") or [])}')
    finally:
        if stack is not None:
            stack.stop()
    return 0


def message_text(message: dict[str, Any]) -> str:
    """The text of a contract Message (content shorthand or text parts)."""
    if isinstance(message.get('content'), str):
        return str(message['content'])
    return ''.join(p.get('text', '') for p in message.get('parts') or [] if p.get('type') == 'text')


def failed_reason(parts: list[dict[str, Any]]) -> str:
    """Why the Actor did not answer, from the answer's parts."""
    for part in parts:
        if part.get('type') in ('data-om-actor-failed', 'data-om-observation-failed'):
            data = part.get('data') or {}
            return str(data.get('message') or data.get('error') or part['type'])
    return 'unknown'


def status_line(parts: list[dict[str, Any]]) -> str:
    """A one-line memory status from the `data-om-status` part (and any observation events)."""
    status = next((p.get('data') or {} for p in parts if p.get('type') == 'data-om-status'), None)
    events = [
        f'{(p.get("data") or {}).get("operationType", "?")}:{p["type"].removeprefix("data-om-observation-")}'
        for p in parts
        if str(p.get('type', '')).startswith('data-om-observation-')
    ]
    if not status:
        return f'[memory] {", ".join(events)}' if events else '[memory] (no status)'
    active = (status.get('windows') or {}).get('active') or {}
    messages = active.get('messages') or {}
    observations = active.get('observations') or {}
    line = (
        f'[memory] messages {messages.get("tokens", "?")}/{messages.get("threshold", "?")} tok, '
        f'observations {observations.get("tokens", "?")}/{observations.get("threshold", "?")} tok, '
        f'generation {status.get("generationCount", "?")}'
    )
    return line + (f'  ({", ".join(events)})' if events else '')


def cmd_demo(args: argparse.Namespace) -> int:
    """`om demo`: the bundled conversation through the HTTP API of an embedded local stack."""
    from om_cli.demo import run_demo

    config = None
    if args.config:
        from om_lib.config import load_config

        config = load_config(path=args.config).to_json_dict()
    run_demo(config=config, out=args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `om` command line."""
    parser = argparse.ArgumentParser(prog='om', description='Observational Memory: local tools')
    sub = parser.add_subparsers(dest='command', required=True)

    serve = sub.add_parser('serve', help='the HTTP API on loopback, with background work, on a local AWS')
    serve.add_argument('--host', default='127.0.0.1')
    serve.add_argument('--port', type=int, default=8787)
    serve.add_argument('--config', help='configuration JSON file')
    serve.add_argument('--sweep-interval', type=float, default=60.0, help='seconds between sweeper runs (0: never)')
    serve.set_defaults(run=cmd_serve)

    invoke = sub.add_parser('invoke', help='run one function handler with an event file and print its answer')
    invoke.add_argument('function', help=f'one of {", ".join(FUNCTIONS)}')
    invoke.add_argument('event', help='event JSON file, e.g. events/sweeper/schedule.json')
    invoke.add_argument('--config', help='configuration JSON file')
    invoke.set_defaults(run=cmd_invoke)

    chat = sub.add_parser('chat', help='chat with memory (against --url, or an embedded local stack)')
    chat.add_argument('--url', help='a running `om serve`, e.g. http://127.0.0.1:8787')
    chat.add_argument('--resource', default='local-user')
    chat.add_argument('--thread', default='chat')
    chat.add_argument('--config', help='configuration JSON file (embedded stack only)')
    chat.set_defaults(run=cmd_chat)

    demo = sub.add_parser('demo', help='replay a bundled multi-session conversation and show the memory over time')
    demo.add_argument('--config', help='configuration JSON file (default: small demo thresholds)')
    demo.add_argument('--out', default='om-demo.png', help='where to write the PNG plot (default: om-demo.png)')
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run a subcommand."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == '__main__':
    sys.exit(main())

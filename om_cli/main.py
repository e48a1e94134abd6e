"""Entry point of the `om` command: serve, invoke, chat and demo on the local stack (om_cli/local_stack.py), and
inspect (the memory inspector against any stack, om_cli/inspect.py).

A mistake a user can fix (a bad config file, a port in use, no server at `--url`, a missing event file) is one
clear message on stderr saying what was wrong and how to fix it, with exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import sys
import textwrap
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, urlencode

from om_cli.wiring import QUIET_FUNCTIONS, http_json, model_notice
from om_lib.errors import ConfigError, InvalidIdError
from om_lib.ids import id_problem

if TYPE_CHECKING:
    from om_lib.config import OMConfig

FUNCTIONS = ('api', 'buffer_worker', 'reflection', 'sweeper', 'orphan_uploads')
ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / 'events'
USAGE_ERROR = 2


class UsageError(Exception):
    """A mistake the user can fix; `main` prints the message (what was wrong, how to fix it) and exits with 2."""


# ---------------------------------------------------------------------------------------------------------------------
# om serve
# ---------------------------------------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    """`om serve`: the HTTP API with background work, until Ctrl-C or SIGTERM."""
    from om_cli import local_logs
    from om_cli.local_stack import DESCRIBE_PATH, LocalStack

    config = check_config(args.config)
    check_port_free(args.host, args.port)
    env: dict[str, str] = {}
    if args.allow_origin:
        from functions.origins import parse_origins

        try:
            parse_origins(','.join(args.allow_origin))
        except ValueError as exc:
            raise UsageError(f'--allow-origin: {exc}') from exc
        env['OM_ALLOWED_ORIGINS'] = ','.join(args.allow_origin)
    local_logs.configure(verbose=args.verbose, env=env)
    try:
        stack = LocalStack(
            host=args.host,
            port=args.port,
            config_file=args.config,
            sweep_interval_s=args.sweep_interval,
            env=env,
            allowed_hosts=args.allowed_host or (),
        )
        stack.start()
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise UsageError(port_message(args.host, args.port, exc)) from exc
        raise
    except ValueError as exc:  # a bad OM_STACK_PREFIX and the like: the message says how to fix it
        raise UsageError(str(exc)) from exc
    stopping = stop_on_signals()
    try:
        aws = 'embedded moto server' if stack.embedded else 'AWS_ENDPOINT_URL'
        print(f'om serve: {stack.url}  (AWS: {aws} at {stack.endpoint})', flush=True)
        if stack.listens_everywhere:
            print(
                f'listening on every address ({args.host}): other machines reach it by a name of this one, which '
                'they send as Host: name it with --allowed-host NAME',
                flush=True,
            )
        print(model_notice(), flush=True)
        print(memory_notice(config, args.sweep_interval), flush=True)
        print(f'try: om chat --url {stack.url}     or: curl {stack.url}/health', flush=True)
        print(f'     the memory inspector: open {stack.url}/inspector in your browser', flush=True)
        print(f'     om invoke sweeper events/sweeper/schedule.json --stack {stack.url}', flush=True)
        print(f'(stack description for tools: {stack.url}{DESCRIBE_PATH}; Ctrl-C stops)', flush=True)
        while not stopping.wait(0.5):
            pass
    finally:
        print('stopping ...', file=sys.stderr, flush=True)
        stack.stop()
    return 0


def stop_on_signals() -> threading.Event:
    """An event set by Ctrl-C or `kill` (SIGTERM), so a server stops cleanly; a second signal changes nothing.
    Installed before the server says where it is: a signal sent as soon as that line shows is already handled."""
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    return stopping


def check_config(path: str | None) -> OMConfig:
    """Read and validate the configuration the stack will use before anything starts (ConfigError names the file)."""
    from om_lib.config import load_config

    return load_config(path=path)


def memory_notice(config: OMConfig, sweep_interval_s: float) -> str:
    """One line saying when memory acts with this configuration."""
    s = config.resolved()
    if not s.enabled:
        return 'memory: observational memory is off in this configuration'
    threshold = s.max_message_threshold()
    if s.async_observation_enabled and s.buffer_tokens:
        forced = f' (a step past {s.block_after:,} observes in the request)' if s.block_after else ''
        observes = (
            f'observes in the background every {s.buffer_tokens:,} message tokens and activates those observations '
            f'past {threshold:,} unobserved ones{forced}'
        )
    else:
        # No buffering: the turn that passes the threshold queues the observation (the buffer worker runs it); a
        # step observes in the request only when it still finds it due (it waits for a running one).
        observes = (
            f'observes past {threshold:,} unobserved message tokens, in the background (the turn that passes it '
            'queues it; a step that still finds it due runs it, or waits for it, in the request)'
        )
    sweep = (
        f'a thread quiet for 30 min is observed by the sweeper (every {sweep_interval_s:g} s)'
        if sweep_interval_s
        else 'no sweeper runs (--sweep-interval 0)'
    )
    return f'memory: {observes}; reflects past {s.observation_tokens:,} observation tokens; {sweep}'


def check_port_free(host: str, port: int) -> None:
    """Fail fast, with a fix, when the HTTP API's port is taken (0 means any free port)."""
    if not port:
        return
    with socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(port_message(host, port, exc)) from exc


def port_message(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EACCES:
        return f'port {port} on {host} needs privileges: choose a port above 1023, e.g. --port 8787'
    if exc.errno == errno.EADDRINUSE:
        return (
            f'port {port} on {host} is already in use (another om serve?): stop that process, or choose a free port '
            f'with --port {port + 1} (--port 0 picks any free port)'
        )
    return f'cannot listen on {host}:{port} ({exc.strerror or exc}): check --host and --port'


# ---------------------------------------------------------------------------------------------------------------------
# om invoke
# ---------------------------------------------------------------------------------------------------------------------
def cmd_invoke(args: argparse.Namespace) -> int:
    """`om invoke <function> <event.json>`: one handler, on a fresh local stack or a running `om serve` (--stack)."""
    from om_cli.local_stack import LocalStack, attached, invoke_handler

    event = read_event(args.function, args.event)
    if args.stack:
        description = describe_stack(args.stack)
        print(
            f'om invoke: the running local stack at {args.stack} (AWS at {description["endpoint"]}); '
            'what the function writes stays there',
            file=sys.stderr,
        )
        with attached(description):
            answer = invoke_handler(args.function, event)
    else:
        check_config(args.config)
        print(
            'om invoke: a fresh local stack (embedded emulator, gone when this command ends); '
            'use --stack URL to run against a running `om serve`',
            file=sys.stderr,
        )
        with LocalStack(config_file=args.config, http=False, workers=False, env=QUIET_FUNCTIONS):
            answer = invoke_handler(args.function, event)
    print(json.dumps(answer, indent=2, ensure_ascii=False, default=str))
    return 0


def read_event(function: str, path: str) -> dict[str, Any]:
    """The event file as JSON; a missing or broken file is a UsageError naming the samples to use instead."""
    samples = sorted(p.relative_to(ROOT).as_posix() for p in (EVENTS / function).glob('*.json'))
    hint = f'sample events for {function}: {", ".join(samples[:6])}' + (' ...' if len(samples) > 6 else '')
    try:
        text = Path(path).read_text(encoding='utf-8')
    except FileNotFoundError as exc:
        raise UsageError(f'event file {path} not found; {hint}') from exc
    except OSError as exc:
        raise UsageError(f'cannot read event file {path} ({exc.strerror or exc}); {hint}') from exc
    try:
        event = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f'event file {path} is not JSON ({exc.msg} at line {exc.lineno}); {hint}') from exc
    if not isinstance(event, dict):
        raise UsageError(f'event file {path} must hold a JSON object (a Lambda event); {hint}')
    return event


def describe_stack(url: str) -> dict[str, Any]:
    """The running `om serve`'s description (its AWS endpoint and the functions' environment)."""
    from om_cli.local_stack import DESCRIBE_PATH

    try:
        status, body = http_json(url.rstrip('/'), 'GET', DESCRIBE_PATH, timeout=10)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UsageError(
            f'cannot reach om serve at {url} ({_reason(exc)}): start it with `om serve`, or leave out '
            '--stack to use a fresh local stack'
        ) from exc
    if status != 200 or not isinstance(body, dict) or not body.get('endpoint'):
        raise UsageError(f'{url} is not an `om serve` local stack (GET {DESCRIBE_PATH} answered {status})')
    return body


# ---------------------------------------------------------------------------------------------------------------------
# om chat
# ---------------------------------------------------------------------------------------------------------------------
CHAT_HELP = """\
commands:
  /memory           this thread's observation log, and when the Observer and the Reflector run next
  /threads          this resource's threads (the current one marked)
  /new [ID]         start a new thread (a fresh id unless you name one)
  /recall [QUERY]   this thread's messages from its start, 20 at a time (again: the next 20); with QUERY, the
                    messages closest in meaning to it (needs "retrieval": {"vector": true} in the configuration)
  /help             this list
  /quit             leave (Ctrl-D too)
anything else is sent as your message"""
# What `om chat`, the README's examples and the client's examples call the user and the conversation by default.
DEFAULT_RESOURCE = 'me'
DEFAULT_URL = 'http://127.0.0.1:8787'  # where `om serve` listens by default
DEFAULT_THREAD = 't1'
RECALL_PAGE = 20


def cmd_chat(args: argparse.Namespace) -> int:
    """`om chat`: a REPL against a running `om serve` (--url) or an embedded one."""
    from om_cli.local_stack import LocalStack

    stack = None
    url = args.url
    for name, value in (('--resource', args.resource), ('--thread', args.thread)):
        if (problem := id_problem(value)) is not None:
            raise UsageError(str(InvalidIdError(f'{name} {value!r}', problem)))
    if not url and not args.config and serving(DEFAULT_URL):
        # The README's walk-through: `om serve` in one terminal, `om chat` in another, the inspector in a browser.
        url = DEFAULT_URL
        print(f'(chatting with the om serve at {url}; --config FILE starts an embedded stack instead)')
    if url:
        url = url.rstrip('/')
        try:
            http_json(url, 'GET', '/health', timeout=10)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UsageError(
                f'cannot reach om serve at {url} ({_reason(exc)}): start one with `python3 dev.py om serve`, '
                'or leave out --url to chat with an embedded local stack'
            ) from exc
    else:
        check_config(args.config)
        # The functions' logs would interleave with the conversation; `om serve` shows them.
        stack = LocalStack(port=0, config_file=args.config, env=QUIET_FUNCTIONS).start()
        url = stack.url
        print(f'(embedded local stack at {url}; {model_notice()})')
    try:
        Chat(url, args.resource, args.thread).run()
    finally:
        if stack is not None:
            stack.stop()
    return 0


def serving(url: str) -> bool:
    """Whether an `om serve` answers at `url` (asked briefly: nothing there is the common case)."""
    try:
        status, body = http_json(url, 'GET', '/health', timeout=1)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return status == 200 and isinstance(body, dict) and body.get('status') == 'ok'


class Chat:
    """The `om chat` loop: messages go to `POST /threads/{thread}/chat`, `/commands` to the other routes."""

    def __init__(self, url: str, resource: str, thread: str, *, out: Any = None) -> None:
        self.url = url
        self.resource = resource
        self.thread = thread
        self.out = out or sys.stdout
        self.recall_page = 0  # the next page `/recall` shows of this thread's history

    def say(self, text: str = '') -> None:
        print(text, file=self.out, flush=True)

    def run(self) -> None:
        self.say(
            f'chatting as resource {self.resource!r} in thread {self.thread!r}; /help lists commands, /quit leaves'
        )
        while True:
            try:
                text = input('you> ').strip()
            except EOFError:
                self.say()
                return
            except KeyboardInterrupt:
                self.say()
                return
            if not self.handle(text):
                return

    def handle(self, text: str) -> bool:
        """One input line; False when the user leaves."""
        if not text:
            return True
        if not text.startswith('/'):
            self.chat(text)
            return True
        command, _, rest = text.partition(' ')
        rest = rest.strip()
        if command in ('/quit', '/exit'):
            return False
        actions: dict[str, Callable[[], object]] = {
            '/help': lambda: self.say(CHAT_HELP),
            '/memory': self.memory,
            '/threads': self.threads,
            '/new': lambda: self.new(rest),
            '/recall': lambda: self.recall(rest),
        }
        action = actions.get(command)
        if action is None:
            self.say(f'unknown command {command}; /help lists the commands')
        else:
            action()
        return True

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The API's answer to one call, or None when it failed (after saying why)."""
        try:
            status, answer = http_json(self.url, method, path, body)
        except (urllib.error.URLError, OSError) as exc:
            self.say(f'[0] the server at {self.url} did not answer ({_reason(exc)})')
            return None
        if status == 404 and (answer or {}).get('error', {}).get('code') == 'thread_not_found':
            self.say(f'(thread {self.thread!r} has no messages yet: say something to start it)')
            return None
        if status != 200:
            self.say(f'[{status}] {error_text(answer)}')
            return None
        return answer

    def chat(self, text: str) -> None:
        """Send a message and print the reply as it is written (the streamed route), and when memory is observed."""
        path = f'/threads/{quote(self.thread, safe="")}/chat/stream'
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps({'resourceId': self.resource, 'content': text}).encode(),
            method='POST',
            headers={'Content-Type': 'application/json', 'Accept': 'text/event-stream'},
        )
        try:
            response = urllib.request.urlopen(request, timeout=120)  # noqa: S310 - the user's own server
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                answer = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                answer = raw.decode(errors='replace')
            self.say(f'[{exc.code}] {error_text(answer)}')
            return
        except (urllib.error.URLError, OSError) as exc:
            self.say(f'[0] the server at {self.url} did not answer ({_reason(exc)})')
            return
        printer = _StreamPrinter(self.out)
        with response:
            for raw_line in response:
                line = raw_line.decode('utf-8').rstrip('\r\n')
                if not line.startswith('data: '):
                    continue
                if line == 'data: [DONE]':
                    break
                printer.chunk(json.loads(line[6:]))
        printer.done(self.view())

    def view(self) -> dict[str, Any] | None:
        """`GET …/memory` of this thread (None after saying why it failed)."""
        view = self.call(
            'GET', f'/threads/{quote(self.thread, safe="")}/memory?{urlencode({"resourceId": self.resource})}'
        )
        return view if isinstance(view, dict) else None

    def memory(self) -> None:
        view = self.view()
        if view is None:
            return
        limits = view.get('thresholds') or {}
        upcoming = view.get('upcoming') or {}
        self.say(
            f'memory of thread {self.thread!r} ({view.get("scope")} scope, generation {view.get("generationCount")})'
        )
        bars = (
            ('messages', 'pendingMessageTokens', 'messageTokens', 'Observer', 'observation'),
            ('observations', 'observationTokens', 'observationTokens', 'Reflector', 'reflection'),
        )
        for label, tokens, threshold, role, key in bars:
            bar = token_bar(label, view.get(tokens, 0), limits.get(threshold, 0))
            self.say(f'  {bar}{when_due(role, (upcoming.get(key) or {}).get("tokensLeft"))}')
        self.say(f'  {quiet_sweep_line(upcoming.get("quietSweep") or {})}')
        if view.get('currentTask'):
            self.say(f'  current task: {view["currentTask"]}')
        self.say(textwrap.indent(view.get('observations') or '(nothing observed yet)', '  '))

    def threads(self) -> None:
        path = f'/resources/{quote(self.resource, safe="")}/threads?orderBy=updatedAt&direction=DESC&perPage=20'
        body = self.call('GET', path)
        if body is None:
            return
        found = body.get('threads') or []
        if not found:
            self.say('(no threads yet: say something to start this one)')
        for thread in found:
            mark = '  ← current' if thread['id'] == self.thread else ''
            title = f' "{thread["title"]}"' if thread.get('title') else ''
            self.say(f'  {thread["id"]}{title}  updated {thread.get("updatedAt", "?")}{mark}')

    def new(self, thread_id: str) -> None:
        if thread_id and (problem := id_problem(thread_id)) is not None:
            self.say(f'{InvalidIdError(f"thread id {thread_id!r}", problem)}; still in thread {self.thread!r}')
            return
        self.thread = thread_id or f't-{uuid.uuid4().hex[:8]}'
        self.recall_page = 0
        self.say(
            f'now in thread {self.thread!r} (same resource, so resource-scope memory and working memory carry over)'
        )

    def recall(self, query: str) -> None:
        """This thread's messages from its start, a page at a time; or (vectors on) the messages like `query`."""
        if query:
            self.recall_like(query)
            return
        thread = quote(self.thread, safe='')
        query_string = urlencode({'resourceId': self.resource, 'page': self.recall_page, 'perPage': RECALL_PAGE})
        page = self.call('GET', f'/threads/{thread}/messages?{query_string}')
        if page is None:
            return
        messages = page.get('messages') or []
        first = self.recall_page * RECALL_PAGE + 1
        if not messages:
            self.say('(no more messages; /recall starts again from the first)' if self.recall_page else '(no messages)')
            self.recall_page = 0
            return
        more = page.get('hasMore')
        self.say(f'messages {first}-{first + len(messages) - 1} of thread {self.thread!r}, oldest first:')
        for message in messages:
            self.say(history_line(message, here=self.thread))
        self.recall_page = self.recall_page + 1 if more else 0
        self.say(f'(/recall again for the next {RECALL_PAGE})' if more else '(that is all of it)')

    def recall_like(self, query: str) -> None:
        """The messages closest in meaning to `query`, with their neighbours (`POST …/messages/query`)."""
        body = {'resourceId': self.resource, 'perPage': 0, 'vectorSearchString': query}
        path = f'/threads/{quote(self.thread, safe="")}/messages/query'
        try:
            status, answer = http_json(self.url, 'POST', path, body)
        except (urllib.error.URLError, OSError) as exc:
            self.say(f'[0] the server at {self.url} did not answer ({_reason(exc)})')
            return
        if status == 422 and 'vector' in error_text(answer):
            self.say(
                'searching by meaning needs vectors: add "retrieval": {"vector": true} to the configuration '
                "(om serve --config FILE) and start again; /recall without words lists this thread's messages"
            )
            return
        if status == 404:
            self.say(f'(thread {self.thread!r} has no messages yet: say something to start it)')
            return
        if status != 200:
            self.say(f'[{status}] {error_text(answer)}')
            return
        found = answer.get('messages') or []
        self.say(f'{len(found)} message(s) like {query!r}, with their neighbours:' if found else '(nothing found)')
        for message in found:
            self.say(history_line(message, here=self.thread))


class _StreamPrinter:
    """Prints a streamed turn: `observing memory…` while the Observer (or Reflector) runs, the reply as it arrives,
    then the memory's status line."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.parts: list[dict[str, Any]] = []
        self.replying = False
        self.error = ''

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def chunk(self, chunk: dict[str, Any]) -> None:
        kind = str(chunk.get('type', ''))
        if kind.startswith('data-om-'):
            part: dict[str, Any] = {'type': kind, 'data': chunk.get('data') or {}}
            if kind == 'data-om-status':  # the windows the Actor got replace the first look
                self.parts = [p for p in self.parts if p['type'] != kind]
            self.parts.append(part)
            operation = 'reflecting' if part['data'].get('operationType') == 'reflection' else 'observing'
            if kind == 'data-om-observation-start':
                self.write(f'  … {operation} memory\n')
            elif kind in ('data-om-observation-end', 'data-om-observation-failed'):
                outcome = 'done' if kind.endswith('end') else 'failed, kept for later'
                self.write(f'  … {operation} {outcome}\n')
        elif kind == 'text-delta':
            if not self.replying:
                self.replying = True
                self.write('assistant> ')
            self.write(str(chunk.get('delta', '')))
        elif kind == 'error':
            self.error = str(chunk.get('errorText') or chunk.get('code') or 'the turn failed')

    def done(self, view: dict[str, Any] | None = None) -> None:
        """End the turn's output: the reply's last line, or why there was none, then the memory's status line (from
        `view`, the thread's `GET …/memory`, when given)."""
        if self.replying:
            self.write('\n')
        else:
            reason = self.error or failed_reason(self.parts)
            self.write(f'assistant> (no reply: {reason})\n')
        self.write(f'  {status_line(self.parts, view)}\n')


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, 'reason', None) or exc
    return getattr(reason, 'strerror', None) or str(reason)


def error_text(body: Any) -> str:
    """The message of an error answer (the contract's `{"error": {"code", "message"}}`)."""
    error = body.get('error') if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = f'{error["code"]}: ' if error.get('code') else ''
        return f'{code}{error.get("message", "")}'
    return str(body)


def token_bar(label: str, value: Any, limit: Any, width: int = 24) -> str:
    """`messages      [██████░░░░░░…]   1,200 / 30,000 tokens`."""
    value, limit = int(value or 0), int(limit or 0)
    filled = min(width, round(width * value / limit)) if limit else 0
    return f'{label:<13} [{"█" * filled}{"░" * (width - filled)}] {value:>7,} / {limit:,} tokens'


def when_due(role: str, tokens_left: Any) -> str:
    """`: the Observer runs in 145 more` (or that it is due)."""
    if tokens_left is None:
        return ''
    if int(tokens_left) <= 0:
        return f': due, the {role} runs now in the background or with the next message'
    return f': the {role} runs in {int(tokens_left):,} more'


def quiet_sweep_line(sweep: dict[str, Any]) -> str:
    """When the sweeper observes this thread if nothing more is said (`GET …/memory`'s `upcoming.quietSweep`)."""
    minutes = round(int(sweep.get('quietAfterSeconds') or 0) / 60)
    if not sweep.get('quietAt'):
        return f'quiet thread: nothing unobserved (the sweeper observes a thread {minutes} min after its last message)'
    if not sweep.get('sweptBy'):
        return (
            f'quiet thread: counts as quiet at {clock_time(sweep["quietAt"])} ({minutes} min after the last message), '
            'but no sweeper runs on this stack'
        )
    return (
        f'quiet thread: if nothing more is said, the sweeper observes it by {clock_time(sweep["sweptBy"])} '
        f'({minutes} min after the last message, even below the threshold)'
    )


def clock_time(iso_time: str) -> str:
    """`14:05` in local time (with the date when it is not today)."""
    from datetime import datetime

    moment = datetime.fromisoformat(iso_time.replace('Z', '+00:00')).astimezone()
    same_day = moment.date() == datetime.now().astimezone().date()
    return moment.strftime('%H:%M' if same_day else '%b %d %H:%M')


def history_line(message: dict[str, Any], *, here: str) -> str:
    """One stored message for a reader: time, who, where it stands in memory, the text."""
    who = {'user': 'you', 'assistant': 'assistant'}.get(message.get('role', ''), message.get('role', '?'))
    status = {'observed': 'observed', 'buffered': 'buffered', 'unobserved': 'not observed yet'}.get(
        message.get('omStatus') or '', ''
    )
    other = message.get('threadId')
    where = f', thread {other!r}' if other and other != here else ''
    when = clock_time(message['createdAt']) if message.get('createdAt') else '?'
    text = message_text(message) or ' '.join(f'[{p.get("type")}]' for p in message.get('parts') or [])
    return f'  {when} {who}{f" ({status}{where})" if status or where else ""}: {text}'


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


def status_line(parts: list[dict[str, Any]], view: dict[str, Any] | None = None) -> str:
    """One line after a reply: how far memory is from observing and reflecting (from `GET …/memory` when given, else
    the answer's `data-om-status`), the generation, and what memory did in this turn in words."""
    events = memory_events(parts)
    if view is not None:
        limits = view.get('thresholds') or {}
        upcoming = view.get('upcoming') or {}
        observe = threshold_status(
            'observation',
            view.get('pendingMessageTokens'),
            limits.get('messageTokens'),
            (upcoming.get('observation') or {}).get('tokensLeft'),
            queued='observe' in scheduled_operations(parts),
        )
        reflect = threshold_status(
            'reflection',
            view.get('observationTokens'),
            limits.get('observationTokens'),
            (upcoming.get('reflection') or {}).get('tokensLeft'),
        )
        line = f'[memory] {observe} · {reflect} · generation {view.get("generationCount", "?")}'

    else:
        status = next((p.get('data') or {} for p in parts if p.get('type') == 'data-om-status'), None)
        if not status:
            return f'[memory] {", ".join(events)}' if events else '[memory] (no status)'
        active = (status.get('windows') or {}).get('active') or {}
        messages, observations = active.get('messages') or {}, active.get('observations') or {}
        line = (
            f'[memory] messages {messages.get("tokens", "?")}/{messages.get("threshold", "?")} tokens · '
            f'observations {observations.get("tokens", "?")}/{observations.get("threshold", "?")} tokens · '
            f'generation {status.get("generationCount", "?")}'
        )
    return line + (f' · {", ".join(events)}' if events else '')


def threshold_status(what: str, tokens: Any, threshold: Any, left: Any, *, queued: bool = False) -> str:
    """`observation in 72 tokens (48/120)`; at the threshold, that it is due (or already queued)."""
    figures = f'({int(tokens or 0):,}/{int(threshold or 0):,})'
    if left is None:
        return f'{what} off'
    if int(left) > 0:
        return f'{what} in {int(left):,} tokens {figures}'
    return f'{what} {"running in the background" if queued else "due with the next message"} {figures}'


def scheduled_operations(parts: list[dict[str, Any]]) -> list[str]:
    """What the request queued for the background (`data-om-scheduled`)."""
    return [
        str(op)
        for p in parts
        if p.get('type') == 'data-om-scheduled'
        for op in (p.get('data') or {}).get('operations') or []
    ]


def memory_events(parts: list[dict[str, Any]]) -> list[str]:
    """What memory did in this turn, in words (a reflection's intermediate ladder attempts are left out)."""
    events: list[str] = []
    for part in parts:
        kind = str(part.get('type', '')).removeprefix('data-om-')
        data = part.get('data') or {}
        reflection = data.get('operationType') == 'reflection'
        if kind == 'observation-end':
            before, after = data.get('tokensObserved', 0), data.get('observationTokens', 0)
            event = (
                f'reflected: {before:,} → {after:,} observation tokens'
                if reflection
                else f'observed {before:,} message tokens'
            )
        elif kind in ('observation-failed', 'buffering-failed') and not data.get('retrying'):
            event = f'{"reflection" if reflection else "observation"} failed ({data.get("reason", "error")})'
        elif kind == 'buffering-start':
            event = 'reflecting in the background' if reflection else 'observing in the background'
        elif kind == 'activation':
            event = 'background reflection activated' if reflection else 'background observations activated'
        else:
            continue
        if event not in events:
            events.append(event)
    return events


# ---------------------------------------------------------------------------------------------------------------------
# om inspect
# ---------------------------------------------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    """`om inspect`: the memory inspector on loopback, its API calls forwarded (and signed) to --api-url."""
    from om_cli import inspect

    check_port_free('127.0.0.1', args.port)
    try:
        api_url = inspect.check_api_url(args.api_url)
        upstream = inspect.Upstream(
            api_url, inspect.make_signer(args.auth, api_url, token=args.token, region=args.region)
        )
        inspect.check_reachable(upstream)
        server = inspect.InspectServer(upstream, port=args.port)
    except inspect.InspectError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        raise UsageError(port_message('127.0.0.1', args.port, exc)) from exc
    stopping = stop_on_signals()
    with server:
        print(f'om inspect: {server.url}  (API: {api_url}, auth: {args.auth}; Ctrl-C stops)', flush=True)
        while not stopping.wait(0.5):
            pass
        print('stopping ...', file=sys.stderr, flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# om demo
# ---------------------------------------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """`om demo`: the bundled conversation through the HTTP API of an embedded local stack."""
    from om_cli.demo import run_demo

    check_writable(args.out)
    config = None
    if args.config:
        from om_lib.config import load_config

        config = load_config(path=args.config).to_json_dict()
    run_demo(config=config, out=args.out)
    return 0


def check_writable(path: str) -> None:
    """Fail before the demo runs when its plot could not be written where `--out` says."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise UsageError(f'--out {path} is a directory: name the PNG file, e.g. --out {target / "om-demo.png"}')
    if not folder.is_dir():
        raise UsageError(f'--out {path}: the directory {folder} does not exist; create it or choose another path')
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f'--out {path}: cannot write there (permission denied); choose another path')


# ---------------------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------------------
class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and examples kept as written; a default shown when there is one (not `None`, not a flag's
    `False`, not when the help already says what happens without the option)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        # Line breaks as written; an unindented line longer than the terminal is wrapped (an indented one is a list
        # or an example: kept).
        lines = text.splitlines()
        wrapped = [line if line.startswith(' ') else textwrap.fill(line, width) or line for line in lines]
        return textwrap.indent('\n'.join(wrapped), indent)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or '(default' in (action.help or ''):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line naming the command and how to get help, and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f'{self.prog}: {message} (see {self.prog} --help)\n')


def port_number(text: str) -> int:
    """`--port`: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f'{text!r} is not a port: use 1-65535 (e.g. --port 8788), 0 for any free one')
    return port


def seconds(text: str) -> float:
    """`--sweep-interval`: a number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float('inf'):
        raise argparse.ArgumentTypeError(f'{text!r} is not a number of seconds: use 0 or more, e.g. 10 (0: never)')
    return value


DESCRIPTION = (
    'Observational Memory on your machine: the HTTP API of the deployed service (same handler code), its background '
    'workers and an AWS emulator, in one process. Without GEMINI_API_KEY every model call runs on the built-in '
    'offline model (deterministic, no network).'
)

EXAMPLES = """\
examples:
  om demo                                      replay a bundled conversation; prints a table and writes om-demo.png
  om serve --config examples/quickstart.json   the API on http://127.0.0.1:8787, thresholds small enough to watch
  om chat --url http://127.0.0.1:8787          chat with it in the terminal (/help inside)
  om serve --config om.json --port 8788        your configuration, on another port
  om chat                                      chat with an embedded stack (no om serve needed)
  om invoke sweeper events/sweeper/schedule.json --stack http://127.0.0.1:8787
  om inspect --api-url https://abc123.execute-api.eu-west-1.amazonaws.com/prod   the inspector against AWS

environment: GEMINI_API_KEY (use Gemini), AWS_ENDPOINT_URL (a shared emulator instead of the embedded one), \
OM_TABLE_NAME, OM_BUCKET_NAME, OM_STACK_PREFIX (resource names on a shared emulator), OM_CONFIG_FILE / OM_CONFIG. \
Every option of the configuration file: docs/configuration.md."""


def build_parser() -> argparse.ArgumentParser:
    """The `om` command line."""
    parser = _Parser(prog='om', description=DESCRIPTION, epilog=EXAMPLES, formatter_class=_Help)
    sub = parser.add_subparsers(dest='command', required=True, metavar='COMMAND', parser_class=_Parser)
    config_help = 'configuration JSON file, e.g. om.json with {"observation": {"messageTokens": 2000}}'

    serve = sub.add_parser(
        'serve',
        help='the HTTP API on loopback, with background work, on a local AWS',
        description='The HTTP API of the deployed service on loopback (the same handler code), with the buffer worker, '
        'the reflection workflow and the sweeper running in this process against an embedded AWS emulator (or '
        'AWS_ENDPOINT_URL). It also serves the memory inspector at /inspector: open that URL in your browser.',
        epilog='examples:\n  om serve --config examples/quickstart.json     small thresholds: memory acts within a few '
        'messages\n  om serve --config om.json --port 8788 --sweep-interval 10',
        formatter_class=_Help,
    )
    serve.add_argument('--host', default='127.0.0.1', help='interface to listen on, e.g. --host 0.0.0.0 (all)')
    serve.add_argument(
        '--port', type=port_number, default=8787, help='port of the API, e.g. --port 8788 (0: any free port)'
    )
    serve.add_argument('--config', metavar='FILE', help=config_help)
    serve.add_argument(
        '--allowed-host',
        action='append',
        metavar='NAME',
        help='a name clients may reach the server by besides 127.0.0.1, localhost and [::1] (the Host header), '
        'e.g. --allowed-host devbox.local (repeatable; other Host names are refused, against DNS rebinding)',
    )
    serve.add_argument(
        '--sweep-interval',
        type=seconds,
        default=60.0,
        metavar='S',
        help='seconds between sweeper runs, e.g. 10 (0: never); a run observes the threads quiet for 30 minutes '
        'that have unobserved messages, below the threshold too',
    )
    serve.add_argument(
        '--allow-origin',
        action='append',
        metavar='ORIGIN',
        help="a web app's origin whose pages may write to this API (others are refused with 403), e.g. "
        '--allow-origin http://localhost:5173; repeat it for several',
    )
    serve.add_argument(
        '--verbose', action='store_true', help="the functions' full JSON logs and metrics, and the emulator's requests"
    )
    serve.set_defaults(run=cmd_serve)

    invoke = sub.add_parser(
        'invoke',
        help='run one function handler with an event file and print its answer',
        description='Run one Lambda handler in this process with an event file, as Lambda would, and print what it '
        'answers: on a fresh local stack (gone afterwards), or on a running `om serve` with --stack.',
        epilog='examples:\n  om invoke api events/api/health_get.json\n'
        '  om invoke sweeper events/sweeper/schedule.json --stack http://127.0.0.1:8787',
        formatter_class=_Help,
    )
    invoke.add_argument('function', choices=FUNCTIONS, help='the function to run')
    invoke.add_argument('event', help='event JSON file, e.g. events/sweeper/schedule.json (events/<function>/*.json)')
    invoke.add_argument('--config', metavar='FILE', help=config_help + ' (fresh stack only)')
    invoke.add_argument(
        '--stack', metavar='URL', help='a running om serve whose store and queues to use, e.g. http://127.0.0.1:8787'
    )
    invoke.set_defaults(run=cmd_invoke)

    chat = sub.add_parser(
        'chat',
        help='chat with memory in the terminal (with a running om serve, or an embedded local stack)',
        description='A terminal chat through POST /threads/{thread}/chat; after each reply, how far memory is from '
        'observing and reflecting.\n\n' + CHAT_HELP,
        epilog='examples:\n'
        '  om chat                                     the om serve on the default port, if one runs\n'
        '  om chat --url http://127.0.0.1:8788 --resource alice --thread trip\n'
        '  om chat --config examples/quickstart.json   an embedded stack with this configuration',
        formatter_class=_Help,
    )
    chat.add_argument(
        '--url',
        help='a running om serve, e.g. --url http://127.0.0.1:8788 (default: the om serve on '
        f'{DEFAULT_URL} when one is running, else an embedded local stack)',
    )
    chat.add_argument('--resource', default=DEFAULT_RESOURCE, help='whose memory (a user), e.g. --resource alice')
    chat.add_argument('--thread', default=DEFAULT_THREAD, help='the conversation, e.g. --thread trip-planning')
    chat.add_argument('--config', metavar='FILE', help=config_help + ' (embedded stack only)')
    chat.set_defaults(run=cmd_chat)

    inspect = sub.add_parser(
        'inspect',
        help='the memory inspector in your browser, against a deployed stack (signs its API calls)',
        description='Serve the memory inspector page on a loopback port and forward its read-only API calls to '
        "--api-url, signed with SigV4 (--auth iam: your AWS credential chain, execute-api in the URL's region) or "
        'a bearer token (--auth bearer: --token or $OM_BEARER_TOKEN), so the browser needs no credentials. '
        '`om serve` serves the same page itself at /inspector.',
        epilog='examples:\n'
        '  om inspect --api-url https://abc123.execute-api.eu-west-1.amazonaws.com/prod\n'
        '  OM_BEARER_TOKEN=$(get-token) om inspect --api-url https://memory.example.com --auth bearer --port 8790',
        formatter_class=_Help,
    )
    inspect.add_argument(
        '--api-url',
        required=True,
        metavar='URL',
        help='the API base URL, stage included, e.g. --api-url https://abc123.execute-api.eu-west-1.amazonaws.com/prod',
    )
    inspect.add_argument('--auth', choices=('none', 'iam', 'bearer'), default='iam', help='how to sign the API calls')
    inspect.add_argument(
        '--token', help='bearer token for --auth bearer (default: $OM_BEARER_TOKEN), e.g. --token "$(get-token)"'
    )
    inspect.add_argument(
        '--region',
        help='AWS region for --auth iam when the URL does not name one (custom domains), e.g. --region eu-west-1',
    )
    inspect.add_argument(
        '--port', type=port_number, default=8790, help='loopback port of the page, e.g. --port 8791 (0: any)'
    )
    inspect.set_defaults(run=cmd_inspect)

    demo = sub.add_parser(
        'demo',
        help='replay a bundled multi-session conversation and show the memory over time',
        description='Replay a four-session conversation through the HTTP API of an embedded local stack; print the '
        'settings, a table of tokens per step with the observation and reflection events, the final memory, and '
        'write a plot.',
        epilog='example: om demo --out /tmp/demo.png --config om.json',
        formatter_class=_Help,
    )
    demo.add_argument('--config', metavar='FILE', help=config_help + ' (default: small demo thresholds)')
    demo.add_argument(
        '--out', default='om-demo.png', metavar='PNG', help='where to write the plot, e.g. --out demo.png'
    )
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run a subcommand; a user's mistake is one message and exit status 2."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command they were given to, with its help
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices  # noqa: SLF001
        commands[args.command].error(f'unrecognized arguments: {" ".join(unknown)}')
    try:
        return int(args.run(args))
    except UsageError as exc:
        return fail(args.command, str(exc))
    except ConfigError as exc:
        return fail(args.command, f'{exc}\nfix the file (docs/configuration.md lists every option) and run it again')
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def fail(command: str, message: str) -> int:
    print(f'om {command}: {message}', file=sys.stderr)
    return USAGE_ERROR


if __name__ == '__main__':
    sys.exit(main())

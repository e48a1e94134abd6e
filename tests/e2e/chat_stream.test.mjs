// The streamed chat route read by the real AI SDK (`ai`, pinned in tests/tools), as a web app reads it: its UI message
// stream reader, and its chat state (`AbstractChat`) over `DefaultChatTransport`, the transport `useChat` uses.
// Run by tests/e2e/test_chat_stream.py against a running `om serve` (OM_API_URL); prints one JSON report line.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createRequire } from 'node:module';

// The SDK lives in tests/tools/node_modules (NODE_PATH is not read by ES modules: resolve it from there).
const require = createRequire(`${process.cwd()}/`);
const { AbstractChat, DefaultChatTransport, parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } =
  await import(require.resolve('ai'));

const API = process.env.OM_API_URL;
const RESOURCE = process.env.OM_RESOURCE_ID;
const run = Date.now().toString(36);

/** The chat state the SDK's framework bindings keep (React's `useChat` keeps the same in React state). */
class PlainState {
  constructor() {
    this.status = 'ready';
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) { this.messages = [...this.messages, message]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(index, message) { this.messages = this.messages.map((m, i) => (i === index ? message : m)); }
  snapshot(thing) { return structuredClone(thing); }
}

class Chat extends AbstractChat {
  constructor(options) {
    const state = new PlainState();
    super({ ...options, state });
    this.plain = state;
  }
}

function chunkTypes(message) {
  return message.parts.map((part) => part.type);
}

test('the UI message stream reader assembles the streamed turn', async () => {
  const thread = `node-reader-${run}`;
  const response = await fetch(`${API}/threads/${thread}/chat/stream`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ resourceId: RESOURCE, content: 'Hello from the stream reader. I like green tea.' }),
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('x-vercel-ai-ui-message-stream'), 'v1');
  const chunks = [];
  const stream = parseJsonEventStream({ stream: response.body, schema: uiMessageChunkSchema }).pipeThrough(
    new TransformStream({
      transform(result, controller) {
        if (!result.success) throw result.error; // a chunk the SDK's schema does not accept fails the test
        chunks.push(result.value);
        controller.enqueue(result.value);
      },
    }),
  );
  let last;
  for await (const message of readUIMessageStream({ stream, terminateOnError: true })) {
    last = message;
  }
  const types = chunks.map((c) => c.type);
  assert.equal(types[0], 'start');
  assert.equal(types.at(-1), 'finish');
  // the memory parts arrive before `finish`, the status first of them
  const firstOm = types.findIndex((t) => t.startsWith('data-om-'));
  assert.equal(types[firstOm], 'data-om-status');
  assert.ok(types.lastIndexOf('data-om-status') < types.indexOf('finish'));
  assert.equal(last.id, chunks[0].messageId);
  assert.equal(last.role, 'assistant');
  // one status part, updated in place (the preview, then the windows the Actor got)
  assert.equal(chunkTypes(last).filter((t) => t === 'data-om-status').length, 1);
  const text = last.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  assert.ok(text.length > 0);
  console.log(JSON.stringify({ assembled: text, thread }));
});

test('useChat’s transport and chat state send a message and hold the streamed reply', async () => {
  const thread = `node-chat-${run}`;
  const seen = [];
  let finished;
  const chat = new Chat({
    id: thread,
    transport: new DefaultChatTransport({ api: `${API}/threads/${thread}/chat`, body: { resourceId: RESOURCE } }),
    onData: (part) => seen.push(part.type),
    onFinish: (event) => { finished = event; },
  });
  await chat.sendMessage({ text: 'My name is Ana and I live in Porto.' });
  assert.equal(chat.plain.status, 'ready', String(chat.plain.error));
  const [user, reply] = chat.plain.messages;
  assert.equal(user.role, 'user');
  assert.equal(reply.role, 'assistant');
  assert.ok(seen.includes('data-om-status'));
  assert.ok(finished && finished.message.id === reply.id);
  // The reply the chat holds is the one stored for the user's message (same id, same text).
  const page = await (await fetch(`${API}/threads/${thread}/messages?resourceId=${RESOURCE}`)).json();
  assert.deepEqual(page.messages.map((m) => m.id), [user.id, reply.id]);
  const text = reply.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  assert.equal(page.messages[1].parts[0].text, text);

  // Regenerating that answer asks for the same user message again: its stored reply comes back, nothing is stored twice.
  await chat.regenerate();
  assert.equal(chat.plain.status, 'ready', String(chat.plain.error));
  const again = chat.plain.messages.at(-1);
  assert.equal(again.id, reply.id);
  const after = await (await fetch(`${API}/threads/${thread}/messages?resourceId=${RESOURCE}`)).json();
  assert.equal(after.messages.length, 2);
});

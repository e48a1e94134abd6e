// The streamed chat turn (AI SDK UI message stream, protocol v1) and the useChat transport: first against a recorded
// SSE body (the reader and the requests, frame by frame), then against the streaming route of the local stack (what
// a user sees: the text assembled equals the stored reply, memory parts before the finish, an abort loses nothing).
// Run with each AI SDK major.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AbstractChat, type ChatState, readUIMessageStream } from 'ai';
import {
  APIError,
  bearerAuth,
  type ChatStreamChunk,
  MemoryClient,
  MessageConflict,
  readChatStream,
  textOf,
  ThreadNotFound,
  userMessage,
} from 'om-client';
import { type MemoryUIMessage, memoryChatTransport } from 'om-client/ai';
import { apiError, json, ScriptedFetch, servers, uid } from './helpers.js';

const STATUS = {
  windows: {
    active: { messages: { tokens: 420, threshold: 300 }, observations: { tokens: 0, threshold: 400 } },
    buffered: {
      observations: { chunks: 0, messageTokens: 0, projectedMessageRemoval: 0, observationTokens: 0, status: 'idle' },
      reflection: { inputObservationTokens: 0, observationTokens: 0, status: 'idle' },
    },
  },
  recordId: 'rec1',
  threadId: 't1',
  stepNumber: 0,
  generationCount: 0,
};
const CONFIG = { messageTokens: 300, observationTokens: 400, scope: 'thread' };
const CHUNKS: ChatStreamChunk[] = [
  { type: 'start', messageId: 'msg_reply1' },
  { type: 'data-om-status', data: STATUS },
  { type: 'start-step' },
  {
    type: 'data-om-observation-start',
    data: {
      cycleId: 'c1',
      operationType: 'observation',
      startedAt: '2026-11-28T10:00:00Z',
      tokensToObserve: 420,
      recordId: 'rec1',
      threadId: 't1',
      threadIds: ['t1'],
      config: CONFIG,
    },
  },
  {
    type: 'data-om-observation-end',
    data: {
      cycleId: 'c1',
      operationType: 'observation',
      completedAt: '2026-11-28T10:00:02Z',
      durationMs: 2000,
      tokensObserved: 420,
      observationTokens: 35,
      observations: '* 🔴 (10:00) User is Ana, lives in Lisbon.',
      recordId: 'rec1',
      threadId: 't1',
    },
  },
  { type: 'text-start', id: 'txt-0' },
  { type: 'text-delta', id: 'txt-0', delta: 'Hello ' },
  { type: 'text-delta', id: 'txt-0', delta: 'Ana!' },
  { type: 'text-end', id: 'txt-0' },
  { type: 'finish-step' },
  { type: 'data-om-scheduled', data: { operations: ['reflect'] } },
  { type: 'finish' },
];
const HEADERS = {
  'content-type': 'text/event-stream',
  'x-vercel-ai-ui-message-stream': 'v1',
  'cache-control': 'no-cache',
  'x-accel-buffering': 'no',
};

/** The recorded body: one `data:` frame per chunk, then `[DONE]`; served in `size`-byte pieces. */
function sse(chunks: readonly ChatStreamChunk[], size = 7, tail = 'data: [DONE]\n\n'): Response {
  const bytes = new TextEncoder().encode(chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join('') + tail);
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (let i = 0; i < bytes.length; i += size) controller.enqueue(bytes.slice(i, i + size));
      controller.close();
    },
  });
  return new Response(body, { status: 200, headers: HEADERS });
}

async function collect(chunks: AsyncIterable<ChatStreamChunk>): Promise<ChatStreamChunk[]> {
  const found: ChatStreamChunk[] = [];
  for await (const chunk of chunks) found.push(chunk);
  return found;
}

test('the reader yields every chunk in order, typed, until [DONE] (frames split anywhere)', async () => {
  const chunks = await collect(readChatStream(sse(CHUNKS, 5, 'data: [DONE]\n\ndata: {"type":"ignored"}\n\n')));

  assert.deepEqual(chunks, CHUNKS);
  const end = chunks.find((c) => c.type === 'data-om-observation-end');
  assert.ok(end?.type === 'data-om-observation-end');
  assert.equal(end.data.observationTokens, 35); // narrowed: the observation-end data's own fields
});

test('chatStream posts the message with its id and yields the turn; a throttled start is retried', async () => {
  const fetch = new ScriptedFetch(apiError(429, 'too_many_requests', 'slow down', { 'retry-after': '0' }), sse(CHUNKS));
  const om = new MemoryClient({
    apiUrl: 'http://127.0.0.1:9/prod',
    resourceId: 'me',
    fetch: fetch.fetch,
    auth: bearerAuth('tok'),
  });
  const message = userMessage('I am Ana, I live in Lisbon.');

  const chunks = await collect(om.chatStream('t1', message));

  assert.deepEqual(chunks, CHUNKS);
  assert.equal(fetch.requests.length, 2);
  const { request } = fetch.requests[1]!;
  assert.equal(new URL(request.url).pathname, '/prod/threads/t1/chat');
  assert.equal(request.headers.get('accept'), 'text/event-stream');
  assert.equal(request.headers.get('authorization'), 'Bearer tok');
  assert.deepEqual(fetch.bodies()[1], { resourceId: 'me', message });
  const text = chunks.flatMap((c) => (c.type === 'text-delta' ? [c.delta] : [])).join('');
  assert.equal(text, 'Hello Ana!');
});

test('a server that answers chat as JSON is refused clearly; a broken frame and an error chunk surface', async () => {
  const jsonServer = new ScriptedFetch(json(200, { reply: null, parts: [] }));
  const om = new MemoryClient({ apiUrl: 'http://127.0.0.1:9', resourceId: 'me', fetch: jsonServer.fetch });
  await assert.rejects(
    collect(om.chatStream('t1', 'hi')),
    (e: unknown) => e instanceof APIError && e.code === 'stream_unsupported',
  );

  const broken = new Response('data: {"type":"start"}\n\ndata: not json\n\n', { headers: HEADERS });
  await assert.rejects(
    collect(readChatStream(broken)),
    (e: unknown) => e instanceof APIError && e.code === 'invalid_stream',
  );

  const failed: ChatStreamChunk[] = [
    { type: 'start' },
    { type: 'error', errorText: 'the language model is unavailable right now; retry later', code: 'model_unavailable' },
    { type: 'finish', finishReason: 'error' },
  ];
  assert.deepEqual(await collect(readChatStream(sse(failed))), failed);
});

test('aborting stops the stream and rejects with the reason', async () => {
  const controller = new AbortController();
  const slow = new ReadableStream<Uint8Array>({
    start(c) {
      c.enqueue(new TextEncoder().encode(`data: ${JSON.stringify(CHUNKS[0])}\n\n`));
    }, // then nothing: the turn is still running
  });
  const seen: ChatStreamChunk[] = [];

  const reading = (async () => {
    for await (const chunk of readChatStream(new Response(slow, { headers: HEADERS }), controller.signal)) {
      seen.push(chunk);
      controller.abort(new Error('user closed the tab'));
    }
  })();

  await assert.rejects(reading, /user closed the tab/);
  assert.deepEqual(seen, [CHUNKS[0]]);

  // An abort while the reader waits for the next frame ends it the same way.
  const waiting = new ReadableStream<Uint8Array>({ start() {} });
  const later = AbortSignal.timeout(30);
  const alive = setTimeout(() => undefined, 5000); // the abort timer alone does not keep the test's event loop up
  await assert.rejects(collect(readChatStream(new Response(waiting, { headers: HEADERS }), later)), {
    name: 'TimeoutError',
  });
  clearTimeout(alive);
});

test('the useChat transport sends only the newest message to the thread of the chat, with the credentials', async () => {
  const fetch = new ScriptedFetch(sse(CHUNKS));
  const client = new MemoryClient({
    apiUrl: 'http://127.0.0.1:9/prod',
    resourceId: 'me',
    fetch: fetch.fetch,
    auth: bearerAuth(async () => 'jwt'),
  });
  const transport = memoryChatTransport({ client });
  const history: MemoryUIMessage[] = [
    { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'Hi' }] },
    { id: 'a1', role: 'assistant', parts: [{ type: 'text', text: 'Hello!' }] },
    {
      id: 'u2',
      role: 'user',
      parts: [
        { type: 'text', text: 'Here is my ticket.' },
        { type: 'file', mediaType: 'image/png', url: 'data:image/png;base64,iVBORw0KGgo=', filename: 'ticket.png' },
      ],
    },
  ];

  const stream = await transport.sendMessages({
    chatId: 'trip-1',
    messages: history,
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
  });
  let last: MemoryUIMessage | undefined;
  for await (const message of readUIMessageStream<MemoryUIMessage>({ stream })) last = message;

  const { request } = fetch.requests[0]!;
  assert.equal(new URL(request.url).pathname, '/prod/threads/trip-1/chat');
  assert.equal(request.headers.get('authorization'), 'Bearer jwt');
  assert.equal(request.headers.get('accept'), 'text/event-stream');
  // The AI SDK's own body, with the newest user message alone (the server takes its text and files) and whose memory.
  assert.deepEqual(fetch.bodies()[0], {
    id: 'trip-1',
    trigger: 'submit-message',
    messages: [history[2]],
    resourceId: 'me',
  });
  // The AI SDK's own reader assembles the reply and keeps the memory parts on it.
  assert.equal(last?.id, 'msg_reply1');
  const parts = last?.parts ?? [];
  assert.deepEqual(
    parts.filter((p) => p.type === 'text').map((p) => p.text),
    ['Hello Ana!'],
  );
  const memoryParts = parts.filter((p) => p.type.startsWith('data-om-')).map((p) => p.type);
  assert.deepEqual(memoryParts, [
    'data-om-status',
    'data-om-observation-start',
    'data-om-observation-end',
    'data-om-scheduled',
  ]);
});

test('the transport surfaces error answers as the error of their code', async () => {
  const fetch = new ScriptedFetch(apiError(409, 'message_conflict', 'message u1 is stored with other content'));
  const transport = memoryChatTransport({
    client: new MemoryClient({ apiUrl: 'http://127.0.0.1:9', resourceId: 'me', fetch: fetch.fetch }),
    threadId: 't1',
  });

  const sending = transport.sendMessages({
    chatId: 'ignored',
    messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: 'Hi' }] }],
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
  });

  await assert.rejects(sending, MessageConflict);
  assert.equal(new URL(fetch.requests[0]!.request.url).pathname, '/threads/t1/chat');
});

// -- against the streaming route of the local stack -------------------------------------------------------------------
/** The thread's stored messages as `role: text`, once there are at least `count` (the turn may still be finishing;
 * after an early abort, the thread may not even be saved yet: the stream starts before the input is stored). */
async function storedTurn(om: MemoryClient, threadId: string, count: number): Promise<{ id: string; text: string }[]> {
  for (let waited = 0; ; waited += 50) {
    const messages = await om.messages(threadId).then(
      (page) => page.messages,
      (error: unknown) => {
        if (error instanceof ThreadNotFound && waited <= 10_000) return [];
        throw error;
      },
    );
    if (messages.length >= count || waited > 10_000) {
      return messages.map((m) => ({ id: m.id, text: `${m.role}: ${textOf(m)}` }));
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function textOfChunks(chunks: readonly ChatStreamChunk[]): string {
  return chunks.flatMap((c) => (c.type === 'text-delta' ? [c.delta] : [])).join('');
}

test('chatStream on the server: the text assembled is the stored reply, memory parts come before finish', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const threadId = uid('t');
  const message = userMessage('I am Ana and I live in Lisbon with my cat Olive.');

  const chunks = await collect(om.chatStream(threadId, message));
  const again = await collect(om.chatStream(threadId, message)); // the same message: its stored reply, streamed

  const types = chunks.map((c) => c.type);
  const stored = await storedTurn(om, threadId, 2);
  const start = chunks[0];
  assert.ok(start?.type === 'start');
  assert.equal(types.at(-1), 'finish');
  assert.ok(types.includes('text-delta'), types.join());
  assert.ok(types.indexOf('data-om-status') < types.indexOf('finish'), types.join());
  assert.deepEqual(stored, [
    { id: message.id, text: `user: ${textOf(message)}` },
    { id: start.messageId!, text: `assistant: ${textOfChunks(chunks)}` },
  ]);
  assert.equal(textOfChunks(again), textOfChunks(chunks));
  assert.deepEqual(await storedTurn(om, threadId, 2), stored); // nothing stored twice
});

test('a client that aborts mid-stream still gets its turn saved, once; the message sent again streams it', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const threadId = uid('t');
  const message = userMessage('Remember that my locker code is 4711, please.');
  const controller = new AbortController();
  const seen: string[] = [];

  const reading = (async () => {
    for await (const chunk of om.chatStream(threadId, message, { signal: controller.signal })) {
      seen.push(chunk.type);
      if (chunk.type === 'start') controller.abort(new Error('the user closed the tab'));
    }
  })();

  await assert.rejects(reading, /closed the tab/);
  assert.deepEqual(seen, ['start']);
  const stored = await storedTurn(om, threadId, 2);
  assert.equal(stored.length, 2);
  assert.equal(stored[0]!.text, `user: ${textOf(message)}`);
  const again = await collect(om.chatStream(threadId, message));
  assert.equal(`assistant: ${textOfChunks(again)}`, stored[1]!.text);
  assert.deepEqual(await storedTurn(om, threadId, 2), stored);
});

/** The chat state the AI SDK's framework bindings keep (React's `useChat` keeps the same in React state). */
class PlainState implements ChatState<MemoryUIMessage> {
  status: ChatState<MemoryUIMessage>['status'] = 'ready';
  error: Error | undefined = undefined;
  messages: MemoryUIMessage[] = [];
  pushMessage = (message: MemoryUIMessage) => void (this.messages = [...this.messages, message]);
  popMessage = () => void (this.messages = this.messages.slice(0, -1));
  replaceMessage = (index: number, message: MemoryUIMessage) =>
    void (this.messages = this.messages.map((m, i) => (i === index ? message : m)));
  snapshot = <T>(thing: T): T => structuredClone(thing);
}

class Chat extends AbstractChat<MemoryUIMessage> {
  readonly plain: PlainState;
  constructor(options: Omit<ConstructorParameters<typeof AbstractChat<MemoryUIMessage>>[0], 'state'>) {
    const state = new PlainState();
    super({ ...options, state });
    this.plain = state;
  }
}

test("the useChat transport on the server: the chat shows the stored reply and memory's parts; one message sent", async (t) => {
  const env = servers(t);
  if (!env) return;
  const sent: { messages: unknown[] }[] = [];
  const client = new MemoryClient({
    apiUrl: env.api,
    resourceId: uid('r'),
    fetch: async (request) => {
      if (request.method === 'POST') sent.push(JSON.parse(await request.clone().text()) as { messages: unknown[] });
      return fetch(request);
    },
  });
  const threadId = uid('t');
  const chat = new Chat({ id: threadId, transport: memoryChatTransport({ client }) });

  await chat.sendMessage({ text: 'Hi, I am Ana. I collect blue stamps.' });
  await chat.sendMessage({ text: 'What do I collect?' });

  assert.equal(chat.plain.status, 'ready', String(chat.plain.error));
  const stored = await storedTurn(client, threadId, 4);
  const shown = chat.plain.messages.map((m) => ({
    id: m.id,
    text: `${m.role}: ${m.parts.flatMap((p) => (p.type === 'text' ? [p.text] : [])).join('')}`,
  }));
  assert.deepEqual(shown, stored); // what the chat shows is what memory holds, under the same ids
  const reply = chat.plain.messages[3]!;
  const types = reply.parts.map((p) => p.type);
  assert.ok(types.includes('data-om-status'), types.join());
  const status = reply.parts.find((p) => p.type === 'data-om-status');
  assert.equal(status?.type === 'data-om-status' && status.data.threadId, threadId);
  assert.deepEqual(
    sent.map((body) => body.messages.length),
    [1, 1],
  );
});

test('the useChat transport: a chat stopped mid-stream has its turn saved once; the next message goes on', async (t) => {
  const env = servers(t);
  if (!env) return;
  const client = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const threadId = uid('t');
  const chat: Chat = new Chat({
    id: threadId,
    transport: memoryChatTransport({ client }),
    onData: () => void chat.stop(), // the first memory part arrives: the user stops the reply
  });

  await chat.sendMessage({ text: 'My train leaves at 9:40 from Santa Apolónia.' });
  const afterStop = await storedTurn(client, threadId, 2);
  await chat.sendMessage({ text: 'When does my train leave?' });

  assert.equal(afterStop.length, 2);
  assert.match(afterStop[1]!.text, /^assistant: ./);
  const stored = await storedTurn(client, threadId, 4);
  assert.deepEqual(
    stored.map((m) => m.text.split(':')[0]),
    ['user', 'assistant', 'user', 'assistant'],
  );
  assert.deepEqual(stored.slice(0, 2), afterStop);
});

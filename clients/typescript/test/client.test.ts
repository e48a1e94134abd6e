// MemoryClient without a server: what each call sends, retries and backoff, errors by code, auth, aborts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  APIError,
  BY_CODE,
  bearerAuth,
  BufferingDisabled,
  Conflict,
  errorFor,
  HostNotAllowed,
  InProgress,
  InvalidRequest,
  InvalidId,
  InvalidJSON,
  MemoryClient,
  type MemoryClientOptions,
  MessageConflict,
  ModelUnavailable,
  NotFound,
  PayloadTooLarge,
  RateLimited,
  RECALL_DESCRIPTION,
  RECALL_PARAMETERS,
  ServerError,
  ServiceUnavailable,
  ThreadExists,
  ThreadNotFound,
  TooLarge,
  userMessage,
  ValidationFailed,
  WORKING_MEMORY_DESCRIPTION,
  WORKING_MEMORY_PARAMETERS,
} from 'om-client';
import { iamAuth, regionFromUrl } from 'om-client/iam';
import { apiError, hang, json, networkError, ScriptedFetch } from './helpers.js';

const URL_ = 'https://abc123.execute-api.eu-west-1.amazonaws.com/prod';
const STEP = { threadId: 't1', resourceId: 'me', system: '', messages: [], tools: [], parts: [] };
const AT = '2026-01-01T00:00:00Z';
const THREAD = {
  id: 't1',
  resourceId: 'me',
  title: null,
  titlePinned: false,
  createdAt: AT,
  updatedAt: AT,
  metadata: {},
};
const OPERATION = { status: 'done', generationCount: 0, observationTokens: 42, parts: [] };

function client(fetch: ScriptedFetch, options: Partial<MemoryClientOptions> = {}) {
  const sleeps: number[] = [];
  const om = new MemoryClient({
    apiUrl: URL_,
    resourceId: 'me',
    fetch: fetch.fetch,
    sleep: async (ms) => void sleeps.push(ms),
    ...options,
  });
  return { om, sleeps };
}

// -- what is sent ---------------------------------------------------------------------------------------------------
test('a step sends client-side ids, camelCase and plain strings as user messages', async () => {
  const fetch = new ScriptedFetch(json(200, STEP));
  const { om } = client(fetch);

  const result = await om.step('t1', ['hello', userMessage('again', { id: 'm1' })], {
    stepNumber: 2,
    actorModel: 'openai/gpt-5.5',
  });

  const { request } = fetch.requests[0]!;
  assert.equal(request.method, 'POST');
  assert.equal(new URL(request.url).pathname, '/prod/threads/t1/steps');
  assert.equal(request.headers.get('content-type'), 'application/json');
  const [body] = fetch.bodies() as { messages: { id: string; role: string; parts: unknown[] }[] }[];
  assert.match(body!.messages[0]!.id, /^msg_[0-9a-f]{32}$/);
  assert.deepEqual(body, {
    resourceId: 'me',
    stepNumber: 2,
    actorModel: 'openai/gpt-5.5',
    messages: [
      { id: body!.messages[0]!.id, role: 'user', parts: [{ type: 'text', text: 'hello' }] },
      { id: 'm1', role: 'user', parts: [{ type: 'text', text: 'again' }] },
    ],
  });
  assert.equal(result.threadId, 't1');
});

test('a retried write sends the same message ids', async () => {
  const fetch = new ScriptedFetch(apiError(503, 'storage_unavailable'), json(200, { saved: ['x'], parts: [] }));
  const { om } = client(fetch);

  await om.turn('t1', ['Noted.']);

  const [first, second] = fetch.bodies() as { messages: { id: string; role: string }[] }[];
  assert.equal(first!.messages[0]!.role, 'assistant');
  assert.equal(first!.messages[0]!.id, second!.messages[0]!.id);
});

test('ids outside the grammar are refused before anything is sent', async () => {
  const fetch = new ScriptedFetch(json(200, STEP));
  const { om } = client(fetch);

  await assert.rejects(om.step('a/b', ['x']), InvalidId);
  await assert.rejects(om.memory('t1', { resourceId: 'me you' }), InvalidId);
  await assert.rejects(om.step('t1', [{ id: 'bad id', role: 'user', content: 'x' }]), InvalidId);
  assert.equal(fetch.requests.length, 0);
});

test('queries are encoded as SigV4 and API Gateway expect (RFC 3986: %20, never +)', async () => {
  const fetch = new ScriptedFetch(json(200, { threads: [], hasMore: false }));
  const { om } = client(fetch);

  await om.listThreads({ metadata: { topic: "day trips+más (o'k)" } });

  const query = new URL(fetch.requests[0]!.request.url).search;
  assert.match(query, /metadata\.topic=day%20trips%2Bm%C3%A1s%20%28o%27k%29/);
  assert.doesNotMatch(query, /\+/);
});

test('threads, working memory and queries send what the API takes', async () => {
  const fetch = new ScriptedFetch(json(200, { thread: THREAD }));
  const { om } = client(fetch);

  await om.updateThread('t1', { title: null });
  await om.createThread({ title: 'Trip', metadata: { topic: 'travel' } });
  const wmFetch = new ScriptedFetch(json(200, { workingMemory: '# Me', scope: 'thread', format: 'markdown' }));
  await client(wmFetch).om.updateWorkingMemory('# Me', { threadId: 't1' });
  const queryFetch = new ScriptedFetch(json(200, { messages: [], hasMore: false }));
  await client(queryFetch).om.queryMessages('t1', { perPage: null, include: ['m1'] });

  const [patch, create] = fetch.bodies() as Record<string, unknown>[];
  assert.deepEqual(patch, { resourceId: 'me', title: null }); // null removes the title; metadata left as is
  assert.equal(fetch.requests[0]!.request.method, 'PATCH');
  assert.deepEqual(
    { ...create, id: undefined },
    { resourceId: 'me', id: undefined, title: 'Trip', metadata: { topic: 'travel' } },
  );
  assert.equal(wmFetch.requests[0]!.request.method, 'PUT');
  assert.equal(new URL(wmFetch.requests[0]!.request.url).pathname, '/prod/threads/t1/working-memory');
  assert.deepEqual(wmFetch.bodies()[0], { workingMemory: '# Me', resourceId: 'me' });
  assert.deepEqual(queryFetch.bodies()[0], { resourceId: 'me', include: [{ id: 'm1' }], perPage: null });
});

test('observe sends imported messages with their ids and dates; reflect and buffer the resource', async () => {
  const fetch = new ScriptedFetch(json(200, OPERATION));
  const { om } = client(fetch);

  const observed = await om.observe('t1', [
    userMessage('My sister moved to Porto.', { createdAt: '2019-05-04T08:00:00Z' }),
    { role: 'assistant', content: 'Nice!', createdAt: '2019-05-04T08:01:00Z' },
  ]);
  await om.observe('t1'); // the thread's own unobserved messages
  await om.reflect('t1', { resourceId: 'you' });
  await om.buffer('t1');

  assert.deepEqual(
    fetch.requests.map((r) => `${r.request.method} ${new URL(r.request.url).pathname}`),
    [
      'POST /prod/threads/t1/memory/observe',
      'POST /prod/threads/t1/memory/observe',
      'POST /prod/threads/t1/memory/reflect',
      'POST /prod/threads/t1/memory/buffer',
    ],
  );
  const [imported, own, reflect, buffer] = fetch.bodies() as { messages?: { id: string }[] }[];
  assert.deepEqual(imported, {
    resourceId: 'me',
    messages: [
      {
        id: imported!.messages![0]!.id,
        role: 'user',
        parts: [{ type: 'text', text: 'My sister moved to Porto.' }],
        createdAt: '2019-05-04T08:00:00Z',
      },
      { id: imported!.messages![1]!.id, role: 'assistant', content: 'Nice!', createdAt: '2019-05-04T08:01:00Z' },
    ],
  });
  assert.match(imported!.messages![1]!.id, /^msg_/);
  assert.deepEqual(own, { resourceId: 'me' });
  assert.deepEqual(reflect, { resourceId: 'you' });
  assert.deepEqual(buffer, { resourceId: 'me' });
  assert.deepEqual(observed, OPERATION);
});

test('an import without createdAt is refused before anything is sent', async () => {
  const fetch = new ScriptedFetch(json(200, OPERATION));
  const { om } = client(fetch);

  await assert.rejects(
    om.observe('t1', [userMessage('no date', { id: 'undated' })]),
    (error: unknown) => error instanceof TypeError && /createdAt.*undated/.test(error.message),
  );
  assert.equal(fetch.requests.length, 0);
});

test('the memory operations are retried after a lost answer with the same import; buffering_disabled is not', async () => {
  const fetch = new ScriptedFetch(
    networkError('UND_ERR_SOCKET'),
    apiError(504, 'timeout'),
    json(200, { ...OPERATION, status: 'nothing_to_do' }), // the first attempt observed it: the import is known
  );
  const { om } = client(fetch);

  const result = await om.observe('t1', [{ role: 'user', content: 'Hi', createdAt: AT }]);

  assert.equal(result.status, 'nothing_to_do');
  assert.equal(fetch.requests.length, 3);
  assert.equal(new Set(fetch.requests.map((r) => r.body)).size, 1); // the same message ids every time
  const refused = new ScriptedFetch(apiError(422, 'buffering_disabled', 'this memory buffers nothing'));
  const error = await client(refused)
    .om.buffer('t1')
    .catch((e: unknown) => e);
  assert.ok(error instanceof BufferingDisabled && error instanceof InvalidRequest);
  assert.deepEqual(
    [error.status, error.code, error.message],
    [422, 'buffering_disabled', 'this memory buffers nothing'],
  );
  assert.equal(refused.requests.length, 1);
});

// -- retries --------------------------------------------------------------------------------------------------------
test('429, 502, 503 and connection failures are retried with exponential backoff and jitter', async () => {
  const fetch = new ScriptedFetch(
    apiError(429, 'too_many_requests'),
    apiError(502, 'dependency_unavailable'),
    networkError('ECONNREFUSED'),
    json(200, STEP),
  );
  const { om, sleeps } = client(fetch, { retries: { maxRetries: 3, backoffBaseMs: 1000, backoffMaxMs: 3000 } });

  const result = await om.step('t1', ['hi']);

  assert.equal(result.threadId, 't1');
  assert.equal(fetch.requests.length, 4);
  // Half of each ceiling is fixed (1 s, 2 s, then capped at 3 s), half random.
  assert.ok(sleeps[0]! >= 500 && sleeps[0]! <= 1000, String(sleeps));
  assert.ok(sleeps[1]! >= 1000 && sleeps[1]! <= 2000, String(sleeps));
  assert.ok(sleeps[2]! >= 1500 && sleeps[2]! <= 3000, String(sleeps));
});

test('Retry-After is honoured', async () => {
  const fetch = new ScriptedFetch(
    apiError(429, 'too_many_requests', 'slow down', { 'retry-after': '7' }),
    json(200, STEP),
  );
  const { om, sleeps } = client(fetch);

  await om.step('t1', ['hi']);

  assert.deepEqual(sleeps, [7000]);
});

test('retries run out into the error of the code', async () => {
  const fetch = new ScriptedFetch(apiError(429, 'too_many_requests', 'slow down'));
  const { om, sleeps } = client(fetch, { retries: 2 });

  const error = await om.step('t1', ['hi']).catch((e: unknown) => e);

  assert.ok(error instanceof RateLimited);
  assert.equal(error.attempts, 3);
  assert.equal(error.message, 'slow down');
  assert.equal(sleeps.length, 2);
});

test('other errors are not retried and carry status, code and details', async () => {
  const fetch = new ScriptedFetch(apiError(409, 'message_conflict', 'message m1 is stored with other content'));
  const { om, sleeps } = client(fetch);

  const error = await om.turn('t1', ['x']).catch((e: unknown) => e);

  assert.ok(error instanceof MessageConflict);
  assert.equal(error.status, 409);
  assert.deepEqual(error.details, [{ field: 'x', message: 'bad' }]);
  assert.equal(fetch.requests.length, 1);
  assert.deepEqual(sleeps, []);
});

test('chat and its stream are resent with the same message after a lost answer (a message is answered once)', async () => {
  const chatFetch = new ScriptedFetch(networkError('UND_ERR_SOCKET'), json(200, { reply: null, parts: [] }));
  await client(chatFetch).om.chat('t1', 'hello');
  const [first, second] = chatFetch.bodies() as { message: { id: string } }[];
  assert.equal(chatFetch.requests.length, 2);
  assert.deepEqual(second, first); // the same message id: the server returns the reply it gave, or gives it once

  const streamFetch = new ScriptedFetch(
    networkError('UND_ERR_SOCKET'),
    apiError(504, 'timeout'),
    new Response('data: {"type":"start"}\n\ndata: [DONE]\n\n', { headers: { 'content-type': 'text/event-stream' } }),
  );
  const chunks = [];
  for await (const chunk of client(streamFetch).om.chatStream('t1', 'hello')) chunks.push(chunk);
  assert.deepEqual(chunks, [{ type: 'start' }]);
  assert.equal(new Set(streamFetch.requests.map((r) => r.body)).size, 1);
  assert.equal(streamFetch.requests.length, 3);
});

test('409 in_progress (another request is answering the message) throws InProgress, not retried', async () => {
  const fetch = new ScriptedFetch(apiError(409, 'in_progress', 'message m1 is being answered by another request'));
  const error = await client(fetch)
    .om.chat('t1', 'hello')
    .catch((e: unknown) => e);

  assert.ok(error instanceof InProgress && error instanceof Conflict);
  assert.equal(fetch.requests.length, 1);
});

test('an attempt that times out is a transport failure, retried for repeatable calls', async () => {
  const fetch = new ScriptedFetch(hang, json(200, STEP));
  const { om } = client(fetch, { timeoutMs: 50 });

  await om.step('t1', ['hi']);

  assert.equal(fetch.requests.length, 2);
});

test('a thread created by a lost attempt is returned, not refused', async () => {
  const fetch = new ScriptedFetch(networkError('ECONNRESET'), apiError(409, 'thread_exists'), (request) =>
    json(200, { thread: { ...THREAD, id: new URL(request.url).pathname.split('/').at(-1) } }),
  );
  const { om } = client(fetch);

  const thread = await om.createThread({ title: 'Trip' });

  const [create, retry] = fetch.bodies() as { id: string }[];
  assert.equal(create!.id, retry!.id);
  assert.equal(create!.id, thread.id);
  assert.equal(fetch.requests[2]!.request.method, 'GET');
});

test('a delete whose first attempt succeeded is done', async () => {
  const fetch = new ScriptedFetch(networkError('ECONNRESET'), apiError(404, 'thread_not_found'));
  const { om } = client(fetch);

  await om.deleteThread('t1');

  assert.equal(fetch.requests.length, 2);
});

// -- aborts ---------------------------------------------------------------------------------------------------------
test('an abort stops the wait between retries and rejects with the signal reason', async () => {
  const fetch = new ScriptedFetch(apiError(503, 'model_unavailable'));
  const controller = new AbortController();
  const om = new MemoryClient({
    apiUrl: URL_,
    resourceId: 'me',
    fetch: fetch.fetch,
    retries: { backoffBaseMs: 60_000 },
  });

  const pending = om.step('t1', ['hi'], { signal: controller.signal });
  setTimeout(() => controller.abort(new Error('user left')), 20);

  await assert.rejects(pending, /user left/);
  assert.equal(fetch.requests.length, 1);
});

test('an abort stops a request in flight, and an aborted signal sends nothing', async () => {
  const fetch = new ScriptedFetch(hang);
  const { om } = client(fetch);

  await assert.rejects(om.memory('t1', { signal: AbortSignal.timeout(30) }), { name: 'TimeoutError' });
  await assert.rejects(om.health({ signal: AbortSignal.abort() }), { name: 'AbortError' });
  assert.equal(fetch.requests.length, 1);
});

// -- errors ---------------------------------------------------------------------------------------------------------
test('each error code throws its class; an unknown code its status family', () => {
  const cases: [number, string, typeof APIError][] = [
    [404, 'thread_not_found', ThreadNotFound],
    [409, 'message_conflict', MessageConflict],
    [409, 'thread_exists', ThreadExists],
    [400, 'invalid_json', InvalidJSON],
    [413, 'payload_too_large', PayloadTooLarge],
    [413, 'too_large', TooLarge],
    [422, 'validation_error', ValidationFailed],
    [422, 'invalid_id', InvalidId],
    [422, 'buffering_disabled', BufferingDisabled],
    [429, 'too_many_requests', RateLimited],
    [503, 'model_unavailable', ModelUnavailable],
    [503, 'some_new_503_code', ServiceUnavailable],
    [404, 'some_new_404_code', NotFound],
    [418, 'teapot', APIError],
  ];
  for (const [status, code, expected] of cases) {
    const error = errorFor(status, { error: { code, message: 'what to fix', details: [] } });
    assert.equal(error.constructor, expected, code);
    assert.deepEqual([error.code, error.status, error.message], [code, status, 'what to fix']);
    assert.equal(error.name, expected.name);
  }
});

test("every code the server answers has its own class, the Python client's by the same name", (t) => {
  const serverCodes = [
    'invalid_json',
    'validation_error',
    'unauthenticated',
    'forbidden',
    'origin_not_allowed',
    'not_found',
    'thread_not_found',
    'method_not_allowed',
    'message_conflict',
    'in_progress',
    'thread_exists',
    'version_conflict',
    'erased',
    'invalid_input',
    'retrieval_disabled',
    'working_memory_disabled',
    'invalid_working_memory',
    'model_unavailable',
    'model_error',
    'storage_unavailable',
    'internal_error',
    'too_many_requests',
    'dependency_unavailable',
    'timeout',
    'bad_request',
    'invalid_id',
    'too_large',
    'unsupported_media_type',
    'host_not_allowed',
    'buffering_disabled',
  ];
  for (const code of serverCodes) assert.ok(BY_CODE.has(code), code);
  assert.equal(new Set(serverCodes.map((c) => BY_CODE.get(c))).size, serverCodes.length);
  assert.equal(errorFor(421, { error: { code: 'host_not_allowed', message: 'm' } }).constructor, HostNotAllowed);

  const python = process.env.OM_TEST_PYTHON_ERRORS;
  if (!python) {
    if (process.env.OM_TEST_REQUIRE_SERVER) throw new Error('OM_TEST_PYTHON_ERRORS is required');
    t.skip('needs the Python client: run through the test suite');
    return;
  }
  // {code: [status, class name]} of the Python client's classes
  for (const [code, [status, name]] of Object.entries(JSON.parse(python) as Record<string, [number, string]>)) {
    const cls = BY_CODE.get(code);
    assert.deepEqual([cls?.name, cls?.status], [name, status], code);
  }
});

test('a gateway error without our body is still typed', async () => {
  const fetch = new ScriptedFetch(new Response('<html>Bad Gateway</html>', { status: 502 }));
  const { om } = client(fetch, { retries: 0 });

  await assert.rejects(
    om.memory('t1'),
    (error: unknown) => error instanceof ServerError && /Bad Gateway/.test(error.message),
  );
});

// -- auth -----------------------------------------------------------------------------------------------------------
test('a bearer token function is asked per request and once more after a 401', async () => {
  const tokens = ['expired', 'fresh'];
  const fetch = new ScriptedFetch((request) =>
    request.headers.get('authorization') === 'Bearer fresh' ? json(200, STEP) : apiError(401, 'unauthenticated'),
  );
  const { om } = client(fetch, { auth: bearerAuth(async () => tokens.shift() ?? 'none') });

  await om.step('t1', ['hi']);

  assert.deepEqual(
    fetch.requests.map((r) => r.request.headers.get('authorization')),
    ['Bearer expired', 'Bearer fresh'],
  );
  const fixed = new ScriptedFetch(apiError(401, 'unauthenticated'));
  await assert.rejects(client(fixed, { auth: bearerAuth('tok') }).om.step('t1', ['hi']), { code: 'unauthenticated' });
  assert.equal(fixed.requests.length, 1); // a fixed token is not asked again
  assert.throws(() => bearerAuth(' '), /empty/);
});

test('IAM signs with SigV4 for execute-api in the URL region, covering the session token and the body', async () => {
  const fetch = new ScriptedFetch(json(200, STEP));
  const credentials = { accessKeyId: 'AKIDEXAMPLE', secretAccessKey: 'secret', sessionToken: 'session-token' };
  const { om } = client(fetch, { auth: iamAuth({ credentials }) });

  await om.step('t1', [userMessage('one', { id: 'm1' })]);
  await om.step('t1', [userMessage('two', { id: 'm1' })]);

  const [first, second] = fetch.requests.map((r) => r.request.headers);
  assert.match(
    first!.get('authorization')!,
    /^AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE\/\d{8}\/eu-west-1\/execute-api\/aws4_request/,
  );
  assert.match(first!.get('authorization')!, /SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,/);
  assert.equal(first!.get('x-amz-security-token'), 'session-token');
  const signature = (h: Headers) => h.get('authorization')!.split('Signature=')[1];
  assert.notEqual(signature(first!), signature(second!));
  assert.equal(regionFromUrl('https://abc-vpce-1.execute-api.ap-south-2.amazonaws.com/x'), 'ap-south-2');
  assert.equal(regionFromUrl('https://memory.example.com/prod'), undefined);
});

// -- attachments ------------------------------------------------------------------------------------------------------
test('an upload is presigned, then PUT with the signed headers and without the API credentials', async () => {
  const uploadUrl =
    'https://bucket.s3.amazonaws.com/k?X-Amz-SignedHeaders=content-type%3Bhost%3Bx-amz-server-side-encryption';
  const fetch = new ScriptedFetch(
    json(201, { url: 's3://bucket/k', uploadUrl, expiresAt: AT }),
    new Response(null, { status: 500 }),
    new Response(null, { status: 200 }),
  );
  const { om } = client(fetch, { auth: bearerAuth('tok') });

  const part = await om.uploadAttachment('t1', new Uint8Array([137, 80, 78, 71]), {
    filename: 'pass.png',
    mediaType: 'image/png',
  });

  assert.deepEqual(part, {
    type: 'image',
    url: 's3://bucket/k',
    mediaType: 'image/png',
    filename: 'pass.png',
    size: 4,
  });
  assert.deepEqual(fetch.bodies()[0], {
    resourceId: 'me',
    threadId: 't1',
    filename: 'pass.png',
    mediaType: 'image/png',
    size: 4,
  });
  const put = fetch.requests[2]!.request;
  assert.equal(put.method, 'PUT');
  assert.equal(put.headers.get('x-amz-server-side-encryption'), 'AES256');
  assert.equal(put.headers.get('authorization'), null);
  assert.equal(fetch.requests.length, 3); // the 500 was retried
});

test("the tools' declarations are the Python client's, word for word", (t) => {
  const python = process.env.OM_TEST_PYTHON_TOOLS;
  if (!python) {
    if (process.env.OM_TEST_REQUIRE_SERVER) throw new Error('OM_TEST_PYTHON_TOOLS is required');
    t.skip('needs the Python client: run through the test suite');
    return;
  }
  assert.deepEqual(JSON.parse(python), [
    RECALL_DESCRIPTION,
    RECALL_PARAMETERS,
    WORKING_MEMORY_DESCRIPTION,
    WORKING_MEMORY_PARAMETERS,
  ]);
});

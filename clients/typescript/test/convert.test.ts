// How the middleware maps the AI SDK's prompt and output to the API's messages and back.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Message } from 'om-client';
import { fromModelMessage, fromModelOutput, toModelPrompt } from 'om-client/ai';

const AT = '2026-11-28T10:00:00Z';
const stored = (id: string, role: Message['role'], parts: Message['parts']): Message => ({
  id,
  role,
  createdAt: AT,
  parts,
});

test('a user message keeps its text and files: bytes as base64, data URLs split, URLs kept', () => {
  const message = fromModelMessage(
    {
      role: 'user',
      content: [
        { type: 'text', text: 'look' },
        { type: 'file', mediaType: 'image/png', data: new Uint8Array([137, 80, 78, 71]) },
        {
          type: 'file',
          mediaType: 'application/pdf',
          data: new URL('data:application/pdf;base64,JVBERg=='),
          filename: 'a.pdf',
        },
        { type: 'file', mediaType: 'image/jpeg', data: new URL('https://example.com/cat.jpg') },
      ],
    },
    'm1',
  );

  assert.deepEqual(message, {
    id: 'm1',
    role: 'user',
    parts: [
      { type: 'text', text: 'look' },
      { type: 'image', mediaType: 'image/png', data: 'iVBORw==' },
      { type: 'file', mediaType: 'application/pdf', data: 'JVBERg==', filename: 'a.pdf' },
      { type: 'image', mediaType: 'image/jpeg', url: 'https://example.com/cat.jpg' },
    ],
  });
  assert.equal(fromModelMessage({ role: 'system', content: 'app rules' }, 'm2'), undefined); // the app's, never stored
});

test('tool results keep their value and whether they failed', () => {
  const message = fromModelMessage(
    {
      role: 'tool',
      content: [
        {
          type: 'tool-result',
          toolCallId: 'c1',
          toolName: 'trains',
          output: { type: 'json', value: { train: 'IC 521' } },
        },
        {
          type: 'tool-result',
          toolCallId: 'c2',
          toolName: 'trains',
          output: { type: 'error-text', value: 'no trains' },
        },
      ],
    },
    'm3',
  );

  assert.deepEqual(message?.parts, [
    { type: 'tool-result', toolCallId: 'c1', toolName: 'trains', result: { train: 'IC 521' } },
    { type: 'tool-result', toolCallId: 'c2', toolName: 'trains', result: 'no trains', isError: true },
  ]);
});

test('a call output becomes one assistant message: text, reasoning, tool calls with their JSON arguments', () => {
  const [message, ...rest] = fromModelOutput([
    { type: 'reasoning', text: 'the user wants trains' },
    { type: 'text', text: 'Checking.' },
    { type: 'tool-call', toolCallId: 'c1', toolName: 'trains', input: '{"to":"Porto"}' },
    { type: 'source', sourceType: 'url', id: 's1', url: 'https://cp.pt' },
  ]);

  assert.equal(rest.length, 0);
  assert.equal(message?.role, 'assistant');
  assert.match(message?.id ?? '', /^msg_/);
  assert.deepEqual(message?.parts, [
    { type: 'reasoning', text: 'the user wants trains' },
    { type: 'text', text: 'Checking.' },
    { type: 'tool-call', toolCallId: 'c1', toolName: 'trains', args: { to: 'Porto' } },
  ]);
  assert.deepEqual(fromModelOutput([{ type: 'text', text: '' }]), []);
});

test('what memory shows the model keeps tool calls and results in pairs and files it can read', () => {
  const prompt = toModelPrompt([
    stored('m1', 'user', [
      { type: 'text', text: 'Here is my boarding pass.' },
      { type: 'image', mediaType: 'image/png', url: 's3://bucket/k/pass.png', filename: 'pass.png' },
      { type: 'image', mediaType: 'image/png', url: 'https://example.com/map.png' },
    ]),
    // An observation covered this call's pair partly: the result of c0 is gone, the call of c9 too.
    stored('m2', 'assistant', [
      { type: 'reasoning', text: 'hmm' },
      { type: 'text', text: 'Let me check.' },
      { type: 'tool-call', toolCallId: 'c0', toolName: 'gates', args: {} },
      { type: 'tool-call', toolCallId: 'c1', toolName: 'gates', args: { flight: 'TP1' } },
    ]),
    stored('m3', 'tool', [
      { type: 'tool-result', toolCallId: 'c1', toolName: 'gates', result: { gate: 'B4' } },
      { type: 'tool-result', toolCallId: 'c9', toolName: 'gates', result: 'orphan' },
    ]),
    stored('m4', 'system', [{ type: 'text', text: 'similar earlier messages: ...' }]),
  ]);

  assert.deepEqual(prompt, [
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Here is my boarding pass.' },
        { type: 'text', text: '[image pass.png at s3://bucket/k/pass.png]' },
        { type: 'file', mediaType: 'image/png', data: new URL('https://example.com/map.png') },
      ],
    },
    {
      role: 'assistant',
      content: [
        { type: 'text', text: 'Let me check.' },
        { type: 'tool-call', toolCallId: 'c1', toolName: 'gates', input: { flight: 'TP1' } },
      ],
    },
    {
      role: 'tool',
      content: [
        { type: 'tool-result', toolCallId: 'c1', toolName: 'gates', output: { type: 'json', value: { gate: 'B4' } } },
      ],
    },
    { role: 'system', content: 'similar earlier messages: ...' },
  ]);
});

// A chat page on the observational memory API with the AI SDK's `useChat` and om-client's chat transport: the reply
// streams in word by word, an "observing" indicator shows while memory is being observed, and the memory's status is
// shown after each turn.
//
// Build: see README.md (esbuild bundles it from npm into dist/app.js; no CDN). Serve index.html and dist/app.js from
// the same origin as the API (the API answers no CORS preflight), and open
// index.html?resource=<resourceId>&thread=<threadId>. With a JWT-protected API, give the client
// `auth: bearerAuth(() => idToken)`.
import React, { useMemo, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { useChat } from '@ai-sdk/react';
import { MemoryClient } from 'om-client';
import { memoryChatTransport } from 'om-client/ai';

const params = new URLSearchParams(window.location.search);
const API = params.get('api') || window.location.origin;
const RESOURCE = params.get('resource') ?? 'web-user';
const THREAD = params.get('thread') ?? 'web-chat';

/** The memory work still running in a message: observation-start parts whose cycle has no end or failure yet. */
function runningMemoryWork(message) {
  const started = new Map();
  for (const part of message.parts) {
    const cycle = part.data?.cycleId;
    if (part.type === 'data-om-observation-start') started.set(cycle, part.data.operationType ?? 'observation');
    if (part.type === 'data-om-observation-end' || part.type === 'data-om-observation-failed') started.delete(cycle);
  }
  return [...started.values()];
}

/** The latest `data-om-status` part of the conversation (each answer keeps one, updated in place). */
function latestStatus(messages) {
  for (const message of [...messages].reverse()) {
    const part = message.parts.find((p) => p.type === 'data-om-status');
    if (part) return part.data;
  }
  return undefined;
}

function MemoryStatus({ status }) {
  if (!status) return null;
  const { messages, observations } = status.windows.active;
  return (
    <p data-testid="memory-status" className="memory">
      memory: {messages.tokens.toLocaleString()} / {messages.threshold.toLocaleString()} message tokens,{' '}
      {observations.tokens.toLocaleString()} / {observations.threshold.toLocaleString()} observation tokens
    </p>
  );
}

function Message({ message }) {
  const text = message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  const working = message.role === 'assistant' ? runningMemoryWork(message) : [];
  return (
    <li className={message.role} data-testid={`message-${message.role}`}>
      {working.length > 0 && (
        <span data-testid="observing" className="observing">
          {working.includes('reflection') ? 'reflecting…' : 'observing…'}
        </span>
      )}
      <span data-testid="text">{text}</span>
    </li>
  );
}

function App() {
  // The transport sends only the newest message to the chat's thread (the server keeps the conversation and its
  // memory), with the client's credentials, retries and typed errors.
  const transport = useMemo(
    () => memoryChatTransport({ client: new MemoryClient({ apiUrl: API, resourceId: RESOURCE }) }),
    [],
  );
  const { messages, sendMessage, status, error } = useChat({ id: THREAD, transport });
  const [input, setInput] = useState('');
  const submit = (event) => {
    event.preventDefault();
    if (!input.trim()) return;
    sendMessage({ text: input });
    setInput('');
  };
  return (
    <main>
      <h1>Chat with memory</h1>
      <ul data-testid="messages">
        {messages.map((message) => (
          <Message key={message.id} message={message} />
        ))}
      </ul>
      <p data-testid="status" className="status">{status}</p>
      {error && <p data-testid="error" className="error">{error.message}</p>}
      {status === 'ready' && <MemoryStatus status={latestStatus(messages)} />}
      <form onSubmit={submit}>
        <input data-testid="input" value={input} onChange={(e) => setInput(e.target.value)} placeholder="Say something" />
        <button data-testid="send" type="submit" disabled={status === 'submitted' || status === 'streaming'}>
          Send
        </button>
      </form>
    </main>
  );
}

createRoot(document.getElementById('root')).render(<App />);

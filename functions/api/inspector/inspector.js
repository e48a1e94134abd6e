// The memory inspector: a page over the HTTP API (the same routes every client uses), no framework, no build step.
// It calls the API with paths relative to where it is served from: `/inspector` on `om serve`, `/<stage>/inspector`
// on a deployed API, or `om inspect`'s loopback proxy, which signs the calls. Everything the API says is put into the
// page as text (textContent), never as HTML.
'use strict';

(() => {
  const POLL_MS = 2000; // new messages show within 5 s
  const THREADS_EVERY = 5; // re-list the resource's threads every 5th poll
  const PER_PAGE = 50; // messages per page: the page never fetches the whole history
  const GENERATIONS = 100; // the generations route's largest page
  const DIFF_CELLS = 4e6; // past this the line diff falls back to prefix/suffix matching
  const PRIORITIES = {
    '🔴': ['high', 'high priority'],
    '🟡': ['medium', 'medium priority'],
    '🟢': ['low', 'low priority'],
    '✅': ['done', 'completed'],
  };
  const TRIGGERS = {
    initial: 'first generation',
    reflection: 'reflection',
    reset: 'reset (observed messages deleted)',
  };

  const script = document.currentScript;
  const assetBase = new URL('.', script ? script.src : location.href);
  // `/inspector` → `/`, `/prod/inspector` → `/prod/`: the API's routes are siblings of the page.
  const apiBase = new URL(location.pathname.replace(/inspector\/?$/, ''), location.origin);

  const $ = (id) => document.getElementById(id);
  const fmt = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : '—');
  const seg = encodeURIComponent;

  // What the page has fetched for the thread it shows (and the JSON it last rendered): cleared when it changes.
  const threadView = () => ({
    memory: null,
    memoryKey: '',
    messages: null,
    messagesKey: '',
    msgPage: 0,
    generations: null,
    generationsKey: '',
    generationsFor: '',
  });

  const state = {
    resourceId: '',
    threadId: '',
    view: 'memory',
    threads: [],
    ...threadView(),
    reasons: new Map(),
    paused: false,
    timer: null,
    polls: 0,
    generation: 0, // bumped when the selection changes: answers for an older selection are dropped
    readyOnce: false,
  };

  // -- DOM helpers ------------------------------------------------------------------------------------------------
  // A node (HTML or SVG) with attributes (`text` and `dataset` are special; null, undefined and false are left out)
  // and children (nodes, or strings as text).
  function fill(node, attrs, children) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === 'text') node.textContent = value;
      else if (name === 'dataset') Object.assign(node.dataset, value);
      else node.setAttribute(name, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const el = (tag, attrs, ...children) => fill(document.createElement(tag), attrs, children);
  const svg = (tag, attrs, ...children) =>
    fill(document.createElementNS('http://www.w3.org/2000/svg', tag), attrs, children);

  // Text with `code` spans (the failure explanations are the README's words).
  function withCode(text) {
    return String(text)
      .split('`')
      .map((piece, i) => (i % 2 ? el('code', {}, piece) : document.createTextNode(piece)));
  }

  function when(iso) {
    if (!iso) return '—';
    return String(iso).replace('T', ' ').replace(/(\.\d+)?Z$/, ' UTC');
  }

  function setState(name) {
    document.body.dataset.state = name;
    if (name === 'ready' && !state.readyOnce) {
      state.readyOnce = true;
      window.inspectorReadyMs = performance.now(); // the benchmark's "interactive" mark
    }
  }

  // -- the API ------------------------------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, options = {}) {
    const headers = { Accept: 'application/json', 'X-OM-Inspector': '1' };
    if (options.body !== undefined) headers['Content-Type'] = 'application/json';
    let response;
    try {
      response = await fetch(new URL(path, apiBase), {
        method: options.method || 'GET',
        headers,
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
        cache: 'no-store',
      });
    } catch (error) {
      throw new ApiError(0, 'unreachable', 'The API did not answer: is `om serve` (or `om inspect`) still running?');
    }
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (error) {
      body = null;
    }
    if (!response.ok) {
      const problem = body && body.error;
      throw new ApiError(
        response.status,
        (problem && problem.code) || `http_${response.status}`,
        (problem && problem.message) || text.slice(0, 300) || response.statusText,
      );
    }
    return body;
  }

  const query = (params) => new URLSearchParams(params).toString();
  const threadPath = (suffix, params) =>
    `threads/${seg(state.threadId)}${suffix}?${query({ resourceId: state.resourceId, ...params })}`;

  // -- messages to the user -----------------------------------------------------------------------------------------
  function showAlert(parts) {
    const box = $('alert');
    if (!parts) {
      box.hidden = true;
      box.replaceChildren();
      return;
    }
    box.replaceChildren(...parts);
    box.hidden = false;
  }

  function apiProblem(error, doing) {
    if (error.status === 0) return [el('strong', {}, 'No answer from the API. '), ...withCode(error.message)];
    return [
      el('strong', {}, `The API refused ${doing} (${error.status} ${error.code}). `),
      ...withCode(error.message),
      error.status >= 500 ? ' The page tries again every few seconds.' : '',
    ];
  }

  function setLive(text) {
    $('live-status').textContent = text;
  }

  // -- URL (deep links) -------------------------------------------------------------------------------------------
  function writeUrl() {
    const params = {};
    if (state.resourceId) params.resourceId = state.resourceId;
    if (state.threadId) params.threadId = state.threadId;
    if (state.view !== 'memory') params.view = state.view;
    history.replaceState(null, '', `${location.pathname}${Object.keys(params).length ? '?' + query(params) : ''}`);
  }

  // -- choosing a resource and a thread -----------------------------------------------------------------------------
  async function openResource(resourceId, threadId) {
    state.generation += 1;
    const mine = state.generation;
    Object.assign(state, { resourceId, threadId: '', threads: [], ...threadView() });
    $('resource').value = resourceId;
    showAlert(null);
    setState('loading');
    setLive('Loading…');
    if (threadId) {
      // A deep link names the thread: list the resource's threads while its memory loads (one round trip less).
      const listing = loadThreads().then(
        () => state.resourceId === resourceId && state.memory && renderLog(),
        () => {},
      );
      await selectThread(threadId);
      await listing;
      return;
    }
    try {
      await loadThreads();
    } catch (error) {
      if (mine !== state.generation) return;
      $('views').hidden = true;
      $('start').hidden = false;
      showAlert(apiProblem(error, `to list the threads of resource “${resourceId}”`));
      setState('error');
      setLive('Not connected');
      writeUrl();
      return;
    }
    if (mine !== state.generation) return;
    const chosen = threadId || (state.threads[0] && state.threads[0].id);
    if (!chosen) {
      $('views').hidden = true;
      $('start').hidden = false;
      showAlert([
        el('strong', {}, `Resource “${resourceId}” has no threads yet. `),
        'A thread appears with its first message (POST /threads/{threadId}/steps or /chat). Check the id: ids are ' +
          'case-sensitive.',
      ]);
      setState('empty-resource');
      writeUrl();
      schedule();
      return;
    }
    await selectThread(chosen);
  }

  async function loadThreads() {
    const listing = await api(
      `resources/${seg(state.resourceId)}/threads?${query({ orderBy: 'updatedAt', direction: 'DESC', perPage: 100 })}`,
    );
    state.threads = listing.threads || [];
    renderThreadSelect();
  }

  function renderThreadSelect() {
    const select = $('thread');
    const options = state.threads.map((t) =>
      el('option', { value: t.id, title: `updated ${when(t.updatedAt)}` }, `${t.id}${t.title ? ' · ' + t.title : ''}`),
    );
    if (state.threadId && !state.threads.some((t) => t.id === state.threadId)) {
      options.unshift(el('option', { value: state.threadId }, `${state.threadId} (not listed)`));
    }
    if (!options.length) options.push(el('option', { value: '' }, '(no threads)'));
    select.replaceChildren(...options);
    select.disabled = !state.threads.length && !state.threadId;
    select.value = state.threadId || '';
  }

  async function selectThread(threadId) {
    state.generation += 1;
    Object.assign(state, { threadId, ...threadView() });
    renderThreadSelect();
    writeUrl();
    setState('loading');
    await refresh();
  }

  // -- polling ------------------------------------------------------------------------------------------------------
  function schedule() {
    clearTimeout(state.timer);
    state.timer = setTimeout(poll, POLL_MS);
  }

  async function poll() {
    if (state.paused || document.hidden || !state.resourceId) {
      schedule();
      return;
    }
    state.polls += 1;
    if (!state.threadId) {
      // A resource without threads: look again, and open the first thread that appears.
      try {
        await loadThreads();
        if (state.threads.length) {
          showAlert(null);
          await selectThread(state.threads[0].id);
          return;
        }
      } catch (error) {
        /* the alert already says what is wrong */
      }
      schedule();
      return;
    }
    if (state.polls % THREADS_EVERY === 0) loadThreads().catch(() => {});
    await refresh();
  }

  async function refresh() {
    const mine = state.generation;
    clearTimeout(state.timer);
    try {
      const [memory, messages] = await Promise.all([
        api(threadPath('/memory')),
        api(threadPath('/messages', { page: state.msgPage, perPage: PER_PAGE, direction: 'DESC' })),
      ]);
      if (mine !== state.generation) return;
      showAlert(null);
      $('start').hidden = true;
      $('views').hidden = false;
      applyMemory(memory);
      applyMessages(messages);
      if (state.view === 'generations') await loadGenerations();
      if (mine !== state.generation) return;
      setState('ready');
      setLive(`Live · ${new Date().toLocaleTimeString('en-GB')}`);
    } catch (error) {
      if (mine !== state.generation) return;
      if (error.code === 'thread_not_found') {
        $('views').hidden = true;
        $('start').hidden = false;
        showAlert([
          el('strong', {}, `Thread “${state.threadId}” was not found for resource “${state.resourceId}”. `),
          'It may have been deleted, or it belongs to another resource (thread ids are per resource). Pick one of ' +
            'the resource’s threads above.',
        ]);
        setState('missing');
        setLive('Thread not found');
      } else {
        showAlert(apiProblem(error, 'to show this memory'));
        setState(state.memory ? 'ready' : 'error');
        setLive(error.status === 0 ? 'Connection lost · retrying' : 'API error · retrying');
      }
    } finally {
      if (mine === state.generation) schedule();
    }
  }

  // -- the memory view ----------------------------------------------------------------------------------------------
  function applyMemory(memory) {
    const key = JSON.stringify(memory);
    if (key === state.memoryKey) return;
    state.memory = memory;
    state.memoryKey = key;
    renderSummary();
    renderLog();
    renderBars();
    $('current-task').replaceChildren(hintText(memory.currentTask, 'No current task yet.'));
    $('suggested-response').replaceChildren(hintText(memory.suggestedResponse, 'No suggested response yet.'));
    renderArchive();
    renderFailures();
  }

  // -- the archive: observation groups moved out of the active log past its bound --------------------------------------
  function renderArchive() {
    const archive = state.memory.archive || { groups: [], tokens: 0, afterTokens: 0, keepTokens: 0 };
    const box = $('archive');
    const groups = archive.groups || [];
    $('archive-summary').textContent = groups.length
      ? `${groups.length} archived · ${fmt(archive.tokens)} tokens`
      : `nothing archived (the log is archived past ${fmt(archive.afterTokens)} tokens)`;
    if (!groups.length) {
      box.replaceChildren(
        el(
          'p',
          { class: 'empty' },
          `When reflection cannot keep the log small, its oldest groups move here past ${fmt(archive.afterTokens)} ` +
            `tokens (about ${fmt(archive.keepTokens)} stay), with no model call. Nothing is deleted.`,
        ),
      );
      return;
    }
    box.replaceChildren(
      ...groups.map((g) => {
        const range = g.range ? `messages ${g.range.replace(':', '–')}` : 'messages not recorded';
        const tree = parseLog(g.observations);
        return el(
          'section',
          { class: 'obs-group archived', dataset: { id: g.id } },
          el('div', { class: 'group-label' }, `${range} · archived ${when(g.archivedAt)} · ${fmt(g.tokens)} tokens`),
          tree.children.map(renderNode),
        );
      }),
    );
  }

  function hintText(text, empty) {
    return text ? document.createTextNode(text) : el('span', { class: 'empty' }, empty);
  }

  function renderSummary() {
    const m = state.memory;
    const scope =
      m.scope === 'resource'
        ? 'resource scope: one memory shared by every thread of the resource'
        : 'thread scope: this thread’s own memory';
    $('summary').replaceChildren(
      'Thread ',
      el('span', { class: 'mono' }, state.threadId),
      ' of resource ',
      el('span', { class: 'mono' }, state.resourceId),
      ` · ${scope} · `,
      el('span', { id: 'generation-count', dataset: { value: m.generationCount } }, `generation ${m.generationCount}`),
      ` · last observed ${when(m.lastObservedAt)}`,
    );
  }

  // The observation log, parsed into date groups and lines; tags and boundaries become structure.
  function parseLog(text) {
    const root = { kind: 'root', children: [], date: null };
    const stack = [root];
    const top = () => stack[stack.length - 1];
    const normalized = text.replace(/(<\/?thread\b[^>]*>|<\/?observation-group\b[^>]*>)/g, '\n$1\n');
    for (const raw of normalized.split('\n')) {
      const line = raw.replace(/\s+$/, '');
      if (!line.trim()) continue;
      let match = line.match(/^\s*<thread id="([^"]*)">$/);
      if (match) {
        const section = { kind: 'thread', id: match[1], children: [], date: null };
        top().children.push(section);
        stack.push(section);
        continue;
      }
      if (/^\s*<\/thread>$/.test(line)) {
        if (stack.length > 1) stack.pop();
        continue;
      }
      match = line.match(/^\s*<observation-group\b([^>]*)>$/);
      if (match) {
        // Retrieval mode: a group names the messages it came from; shown as a labelled block, never as tags
        const range = (match[1].match(/\brange="([^"]*)"/) || [])[1] || '';
        const group = { kind: 'group', range, children: [], date: null };
        if (top().kind === 'group') stack.pop();
        top().children.push(group);
        stack.push(group);
        continue;
      }
      if (/^\s*<\/observation-group>$/.test(line)) {
        if (top().kind === 'group') stack.pop();
        continue;
      }
      match = line.match(/^\s*--- message boundary \((.+)\) ---$/);
      if (match) {
        // Inside the current date group: the same date after it continues that group, under one heading.
        (top().date || top()).children.push({ kind: 'boundary', at: match[1] });
        continue;
      }
      match = line.match(/^\s*Date:\s*(.+)$/);
      if (match) {
        // Each observation batch (a buffered chunk, a retrieval group) starts with its own `Date:` line: the same
        // date as the open group adds to it instead of repeating the heading, and a group that starts on the day
        // the group before it ended on continues that day under its label, without a second heading.
        const date = match[1].trim();
        if (top().date && top().date.date === date) continue;
        if (top().kind === 'group' && !top().date && !top().children.length && lastDate(stack) === date) continue;
        const group = { kind: 'date', date, children: [] };
        top().children.push(group);
        top().date = group;
        continue;
      }
      const target = top().date || top();
      target.children.push(parseLine(line));
    }
    return root;
  }

  // The day the log was on just before the innermost open block began: the last date heading among the blocks
  // before it (a retrieval group continues the day of the group before it), else the enclosing block's.
  function lastDate(stack) {
    const parent = stack[stack.length - 2];
    if (!parent) return null;
    const siblings = parent.children;
    for (let i = siblings.length - 2; i >= 0; i -= 1) {
      const node = siblings[i];
      const dated = node.kind === 'date' ? [node] : (node.children || []).filter((c) => c.kind === 'date');
      if (dated.length) return dated[dated.length - 1].date;
    }
    return parent.date ? parent.date.date : null;
  }

  function parseLine(line) {
    const indent = line.match(/^\s*/)[0].length;
    let rest = line.trim();
    let sub = indent > 0;
    rest = rest.replace(/^[*-]\s+/, '');
    if (rest.startsWith('->')) {
      sub = true;
      rest = rest.slice(2).trim();
    }
    let priority = null;
    for (const emoji of Object.keys(PRIORITIES)) {
      if (rest.startsWith(emoji)) {
        priority = emoji;
        rest = rest.slice(emoji.length).trim();
        break;
      }
    }
    let time = null;
    const timed = rest.match(/^\((\d{1,2}:\d{2})\)\s*/);
    if (timed) {
      time = timed[1];
      rest = rest.slice(timed[0].length);
    }
    return { kind: 'obs', raw: line, sub, priority, time, text: rest };
  }

  // `: by 2026-11-28 10:42 UTC, 30 minutes after its last message` when the API says when the sweeper comes.
  function sweptBy(m) {
    const sweep = (m.upcoming || {}).quietSweep || {};
    if (!sweep.quietAt) return '';
    const minutes = Math.round((sweep.quietAfterSeconds || 0) / 60);
    return sweep.sweptBy
      ? ` (if nothing more is said, by ${when(sweep.sweptBy)}: ${minutes} minutes after its last message)`
      : ` (it counts as quiet at ${when(sweep.quietAt)}, but no sweeper runs on this stack)`;
  }

  function renderLog() {
    const box = $('log');
    const m = state.memory;
    if (!m.observations || !m.observations.trim()) {
      const pending = fmt(m.pendingMessageTokens);
      const threshold = fmt(m.thresholds.messageTokens);
      box.replaceChildren(
        el(
          'p',
          { class: 'empty', id: 'log-empty' },
          `Nothing observed yet. The Observer runs once this memory’s unobserved messages pass ${threshold} tokens ` +
            `(now ${pending}), or when a quiet thread is swept` + sweptBy(m) + '.',
        ),
      );
      $('log-count').textContent = '';
      return;
    }
    const tree = parseLog(m.observations);
    box.replaceChildren(...tree.children.map(renderNode));
    applyFilter();
  }

  function renderNode(node) {
    if (node.kind === 'thread') {
      const known = state.threads.some((t) => t.id === node.id);
      const label = el(
        'div',
        { class: 'thread-label' },
        'From thread ',
        el('span', { class: 'mono' }, node.id),
        node.id === state.threadId ? ' (this thread)' : '',
      );
      if (known && node.id !== state.threadId) {
        const open = el('button', { type: 'button', class: 'open-thread' }, `Open ${node.id}`);
        open.addEventListener('click', () => selectThread(node.id));
        label.append(' ', open);
      }
      return el('section', { class: 'thread-section', dataset: { thread: node.id } }, label, node.children.map(renderNode));
    }
    if (node.kind === 'group') {
      const [start, end] = node.range.split(',')[0].split(':');
      const last = node.range.split(',').pop().split(':').pop();
      const label = node.range
        ? start === last ? `message ${start}` : `messages ${start}–${last || end}`
        : 'messages not recorded';
      return el(
        'section',
        { class: 'obs-group', dataset: { range: node.range } },
        el('div', { class: 'group-label', title: 'the raw messages these observations came from (recall reads them)' }, label),
        node.children.map(renderNode),
      );
    }
    if (node.kind === 'date') {
      return el(
        'div',
        { class: 'date-group' },
        el('div', { class: 'date', role: 'heading', 'aria-level': '3' }, node.date),
        node.children.map(renderNode),
      );
    }
    if (node.kind === 'boundary') {
      return el('div', { class: 'boundary' }, `observed up to ${when(node.at)}`);
    }
    const priority = node.priority ? PRIORITIES[node.priority] : null;
    return el(
      'div',
      { class: `obs${node.sub ? ' sub' : ''}`, dataset: { raw: node.raw } },
      priority
        ? el('span', { class: `prio prio-${priority[0]}`, title: priority[1] }, el('span', { 'aria-hidden': 'true' }, node.priority + ' '), priority[0])
        : null,
      node.time ? el('span', { class: 'time' }, node.time) : null,
      el('span', { class: 'text' }, node.text),
    );
  }

  function applyFilter() {
    const needle = $('search').value.trim().toLowerCase();
    const lines = [...$('log').querySelectorAll('.obs')];
    let shown = 0;
    for (const line of lines) {
      const hit = !needle || line.dataset.raw.toLowerCase().includes(needle);
      line.hidden = !hit;
      if (hit) shown += 1;
      highlight(line.querySelector('.text'), needle);
    }
    for (const group of $('log').querySelectorAll('.date-group, .thread-section, .obs-group')) {
      group.hidden = Boolean(needle) && !group.querySelector('.obs:not([hidden])');
    }
    for (const boundary of $('log').querySelectorAll('.boundary')) boundary.hidden = Boolean(needle);
    let none = $('log-none');
    if (needle && !shown && lines.length) {
      if (!none) {
        none = el('p', { class: 'empty', id: 'log-none' });
        $('log').append(none);
      }
      none.textContent = `No line matches “${$('search').value.trim()}”.`;
    } else if (none) {
      none.remove();
    }
    $('log-count').textContent = lines.length
      ? needle
        ? `${shown} of ${lines.length} lines match`
        : `${lines.length} lines`
      : '';
  }

  function highlight(span, needle) {
    const text = span.textContent;
    if (!needle) {
      if (span.childElementCount) span.textContent = text;
      return;
    }
    const lower = text.toLowerCase();
    const pieces = [];
    let at = 0;
    for (let i = lower.indexOf(needle); i !== -1; i = lower.indexOf(needle, at)) {
      pieces.push(text.slice(at, i), el('mark', {}, text.slice(i, i + needle.length)));
      at = i + needle.length;
    }
    pieces.push(text.slice(at));
    span.replaceChildren(...pieces);
  }

  function meter(name, label, value, threshold, { block = null, buffered = 0, note = '' } = {}) {
    const top = Math.max(threshold || 0, block || 0, value || 0, 1) * 1.05;
    const pct = (n) => `${Math.min(100, (100 * n) / top).toFixed(2)}%`;
    const share = threshold ? Math.round((100 * value) / threshold) : 0;
    const track = el('div', {
      class: 'track',
      role: 'meter',
      'aria-label': label,
      'aria-valuemin': 0,
      'aria-valuemax': threshold,
      'aria-valuenow': Math.min(value, threshold),
      'aria-valuetext': `${fmt(value)} of ${fmt(threshold)} tokens`,
    });
    const fill = el('div', { class: 'fill' });
    fill.style.width = pct(value);
    track.append(fill);
    if (buffered) {
      const part = el('div', { class: 'fill buffered' });
      part.style.width = pct(Math.min(buffered, value));
      track.append(part);
    }
    const tick = el('div', { class: 'tick', title: `threshold ${fmt(threshold)}` });
    tick.style.left = pct(threshold);
    track.append(tick);
    if (block) {
      const blockTick = el('div', { class: 'tick block', title: `blockAfter ${fmt(block)}` });
      blockTick.style.left = pct(block);
      track.append(blockTick);
    }
    return el(
      'div',
      { class: 'meter', dataset: { metric: name, value, threshold, blockAfter: block ?? '' } },
      el(
        'div',
        { class: 'meter-label' },
        el('span', {}, label),
        el('span', { class: 'figures-text' }, `${fmt(value)} / ${fmt(threshold)} tokens (${share}%)`),
      ),
      track,
      el('p', { class: 'meter-note' }, note),
    );
  }

  function renderBars() {
    const m = state.memory;
    const t = m.thresholds;
    const block = t.blockAfter || {};
    const bo = m.buffered.observations;
    const br = m.buffered.reflection;
    const obsNote =
      `Observes at ${fmt(t.messageTokens)}` +
      (block.observation ? `; past blockAfter ${fmt(block.observation)} a step observes before it answers` : '') +
      (bo.messageTokens ? `; ${fmt(bo.messageTokens)} already buffered (purple)` : '') +
      '.';
    const reflNote =
      `Reflects at ${fmt(t.observationTokens)}` +
      (block.reflection ? `; past blockAfter ${fmt(block.reflection)} a step reflects before it answers` : '') +
      '.';
    $('bars').replaceChildren(
      meter('messages', 'Unobserved messages', m.pendingMessageTokens, t.messageTokens, {
        block: block.observation,
        buffered: bo.messageTokens,
        note: obsNote,
      }),
      meter('observations', 'Observations', m.observationTokens, t.observationTokens, {
        block: block.reflection,
        note: reflNote,
      }),
      el(
        'dl',
        { class: 'buffered-list' },
        el('dt', {}, 'Buffered observations'),
        el(
          'dd',
          { dataset: { metric: 'buffered-observations', chunks: bo.chunks, status: bo.status } },
          bo.chunks
            ? `${bo.chunks} chunk${bo.chunks === 1 ? '' : 's'}: ${fmt(bo.messageTokens)} message tokens → ` +
                `${fmt(bo.observationTokens)} observation tokens · ${bo.status}`
            : `none · ${bo.status}`,
        ),
        el('dt', {}, 'Buffered reflection'),
        el(
          'dd',
          { dataset: { metric: 'buffered-reflection', status: br.status } },
          br.status === 'complete'
            ? `staged: ${fmt(br.inputObservationTokens)} → ${fmt(br.observationTokens)} tokens · activates at ` +
                `${fmt(t.observationTokens)}`
            : br.status,
        ),
      ),
    );
  }

  // -- failures -----------------------------------------------------------------------------------------------------
  function renderNotes() {
    const notes = state.memory.recentNotes || [];
    const box = $('notes');
    if (!notes.length) {
      box.replaceChildren(el('p', { class: 'empty' }, 'No answer was accepted with a doubt.'));
      return;
    }
    box.replaceChildren(
      ...notes.map((n) =>
        el(
          'article',
          { class: 'note', dataset: { note: n.note, operation: n.operationType } },
          el('h3', {}, `${n.operationType} accepted with a note: `, el('span', { class: 'mono' }, n.note), ` · ${when(n.at)}`),
          el('p', {}, NOTE_MEANINGS[n.note] || 'A check was unsure about this answer; it became memory all the same.'),
          el('pre', { class: 'note-text' }, n.message || ''),
        ),
      ),
    );
  }

  const NOTE_MEANINGS = {
    mostly_prose: 'Most of the answer’s lines are prose around a few observation lines; it was kept as written.',
    repeated_item: 'One observation line makes up most of the answer (a faithful summary of a repetitive run may).',
    newest_date_missing: 'The reflection no longer names the log’s newest date (it may write dates another way).',
  };

  function renderFailures() {
    renderNotes();
    const failures = state.memory.recentFailures || [];
    const count = $('failure-count');
    count.textContent = failures.length ? String(failures.length) : '';
    count.className = failures.length ? 'count some' : 'count';
    count.hidden = !failures.length;
    const box = $('failures');
    if (!failures.length) {
      box.replaceChildren(el('p', { class: 'empty' }, 'No failures recorded for this memory.'));
      return;
    }
    box.replaceChildren(
      ...failures.map((f) => {
        const why = state.reasons.get(f.reason);
        const item = (term, ...value) => [el('dt', {}, term), el('dd', {}, ...value)];
        return el(
          'article',
          { class: 'failure', dataset: { reason: f.reason, operation: f.operationType } },
          el('h3', {}, `${f.operationType} failed: `, el('span', { class: 'mono' }, f.reason), ` · ${when(f.at)}`),
          el(
            'dl',
            {},
            why
              ? [
                  item('What it means', ...withCode(why.meaning)),
                  item('What happens next', ...withCode(why.next)),
                  item('What you can do', ...withCode(why.youCan)),
                ]
              : item('What it means', 'No explanation for this reason (README “Failure reasons” lists them).'),
            item('Detail', f.message || '—'),
            f.threadId ? item('Thread', el('span', { class: 'mono' }, f.threadId)) : null,
            item('Where', f.background ? 'a background job (worker or workflow)' : 'inside a request'),
          ),
        );
      }),
    );
  }

  // -- messages -----------------------------------------------------------------------------------------------------
  function applyMessages(page) {
    const key = JSON.stringify(page);
    if (key === state.messagesKey) return;
    state.messages = page;
    state.messagesKey = key;
    renderMessages();
  }

  function renderMessages() {
    const page = state.messages;
    $('msg-page').textContent = `page ${state.msgPage + 1}${state.msgPage ? '' : ' (the newest)'}`;
    $('msg-newest').disabled = state.msgPage === 0;
    $('msg-newer').disabled = state.msgPage === 0;
    $('msg-older').disabled = !page.hasMore;
    const list = $('messages');
    if (!page.messages.length) {
      list.replaceChildren(el('li', { class: 'empty' }, state.msgPage ? 'No messages on this page.' : 'No messages yet.'));
      return;
    }
    list.replaceChildren(
      ...page.messages.map((m) =>
        el(
          'li',
          { class: 'msg', dataset: { id: m.id, status: m.omStatus || '' } },
          el(
            'div',
            { class: 'msg-head' },
            el('span', { class: 'role' }, m.role),
            el('span', { class: `badge st-${m.omStatus}` }, m.omStatus || 'unknown'),
            el('span', { class: 'muted' }, when(m.createdAt)),
            el('span', { class: 'muted mono' }, m.id),
          ),
          (m.parts || []).map(renderPart),
        ),
      ),
    );
  }

  function clip(text, limit = 4000) {
    return text.length > limit ? `${text.slice(0, limit)} … (${fmt(text.length - limit)} more characters)` : text;
  }

  function renderPart(part) {
    switch (part.type) {
      case 'text':
        return el('div', { class: 'msg-body' }, clip(part.text || ''));
      case 'reasoning':
        return el('div', { class: 'msg-body' }, el('span', { class: 'part-label' }, 'reasoning: '), clip(part.text || ''));
      case 'tool-call':
        return el(
          'div',
          { class: 'msg-body' },
          el('span', { class: 'part-label' }, 'tool call: '),
          `${part.toolName}(${clip(JSON.stringify(part.args ?? {}), 2000)})`,
        );
      case 'tool-result':
        return el(
          'div',
          { class: 'msg-body' },
          el('span', { class: 'part-label' }, 'tool result: '),
          `${part.toolName} → ${clip(JSON.stringify(part.result ?? null), 2000)}`,
        );
      case 'image':
      case 'file':
        return el('div', { class: 'msg-body' }, attachment(part));
      default:
        return el('div', { class: 'msg-body' }, el('span', { class: 'part-label' }, `${part.type}: `), clip(JSON.stringify(part), 1000));
    }
  }

  function attachment(part) {
    const name = part.filename || (part.type === 'image' ? 'image' : 'file');
    const label = `${part.type === 'image' ? 'Image' : 'File'}: ${name} (${part.mediaType || 'unknown type'})`;
    if (part.url && /^https?:\/\//i.test(part.url)) {
      return el('a', { class: 'attachment', href: part.url, target: '_blank', rel: 'noopener noreferrer' }, label);
    }
    if (part.data) {
      const href = `data:${part.mediaType || 'application/octet-stream'};base64,${part.data}`;
      return el('a', { class: 'attachment', href, download: name }, `${label}, download`);
    }
    return el(
      'span',
      { class: 'attachment', title: 'stored in the service’s bucket: not downloadable from the browser' },
      `${label} at `,
      el('span', { class: 'mono' }, part.url || '(no location)'),
    );
  }

  async function gotoMessages(page) {
    state.msgPage = Math.max(0, page);
    state.messagesKey = '';
    await refresh();
  }

  // -- generations --------------------------------------------------------------------------------------------------
  async function loadGenerations() {
    const m = state.memory;
    const key = `${state.threadId}|${m.recordId}|${m.generationCount}|${m.observationTokens}`;
    if (state.generations && state.generationsFor === key) return;
    const answer = await api(threadPath('/memory/generations', { limit: GENERATIONS }));
    state.generationsFor = key;
    const answerKey = JSON.stringify(answer);
    if (answerKey === state.generationsKey) return;
    state.generations = answer;
    state.generationsKey = answerKey;
    renderGenerations();
  }

  function renderGenerations() {
    const answer = state.generations;
    const gens = [...answer.generations].reverse(); // oldest first, as the chart reads left to right
    const rows = gens.map((g, i) => {
      const previous = i > 0 && gens[i - 1].generation === g.generation - 1 ? gens[i - 1] : null;
      const start = g.generation === 0 ? 0 : g.initialObservationTokens;
      return { ...g, start, before: g.trigger === 'reflection' && previous ? previous.observationTokens : null };
    });
    const threshold = state.memory.thresholds.observationTokens;
    $('gen-chart').replaceChildren(chart(rows, threshold));
    $('gen-caption').textContent =
      `${rows.length} generation${rows.length === 1 ? '' : 's'}` +
      (answer.hasMore ? ` (the newest ${GENERATIONS}; older ones are not shown)` : '') +
      `; the dashed line is the reflection threshold, ${fmt(threshold)} tokens.`;
    $('gen-table').tBodies[0].replaceChildren(
      ...rows.map((g) =>
        el(
          'tr',
          { dataset: { generation: g.generation } },
          el('th', { scope: 'row' }, `g${g.generation}${g.current ? ' (current)' : ''}`),
          el('td', {}, when(g.createdAt)),
          el('td', {}, TRIGGERS[g.trigger] || g.trigger),
          el('td', { class: 'num' }, fmt(g.start)),
          el('td', { class: 'num', dataset: { tokens: g.observationTokens } }, fmt(g.observationTokens)),
          el('td', { class: 'num' }, g.before !== null && g.start !== null ? `${fmt(g.before)} → ${fmt(g.start)}` : '—'),
        ),
      ),
    );
    renderDiffChoices(rows);
  }

  function chart(rows, threshold) {
    const W = 800;
    const H = 250;
    const left = 64;
    const right = 16;
    const topPad = 28;
    const bottom = 44;
    const values = rows.flatMap((g) => [g.start || 0, g.observationTokens]).concat(threshold || 0);
    const maxY = niceCeiling(Math.max(...values, 1) * 1.1);
    const y = (v) => topPad + (H - topPad - bottom) * (1 - v / maxY);
    const band = (W - left - right) / Math.max(rows.length, 1);
    const bar = Math.max(3, Math.min(26, band * 0.34));
    const parts = [
      svg('title', { id: 'gen-chart-title' }, 'Observation tokens per generation, at start and at end'),
      svg('desc', { id: 'gen-chart-desc' }, 'The table below lists the same figures.'),
    ];
    for (const tick of [0, maxY / 2, maxY]) {
      parts.push(
        svg('line', { x1: left, x2: W - right, y1: y(tick), y2: y(tick), stroke: '#d0d7de' }),
        svg('text', { x: left - 6, y: y(tick) + 4, 'text-anchor': 'end' }, fmt(Math.round(tick))),
      );
    }
    rows.forEach((g, i) => {
      const mid = left + band * i + band / 2;
      if (g.start !== null && g.start !== undefined) {
        parts.push(
          svg('rect', { x: mid - bar - 1, y: y(g.start), width: bar, height: y(0) - y(g.start), fill: '#54aeff' },
            svg('title', {}, `g${g.generation} at start: ${fmt(g.start)} tokens`)),
        );
      }
      parts.push(
        svg('rect', { x: mid + 1, y: y(g.observationTokens), width: bar, height: y(0) - y(g.observationTokens), fill: '#0550ae' },
          svg('title', {}, `g${g.generation} at end: ${fmt(g.observationTokens)} tokens`)),
      );
      if (band >= 22 || i % Math.ceil(22 / band) === 0) {
        parts.push(svg('text', { x: mid, y: H - bottom + 16, 'text-anchor': 'middle' }, `g${g.generation}`));
        if (band >= 60) {
          parts.push(svg('text', { x: mid, y: H - bottom + 31, 'text-anchor': 'middle' }, g.trigger));
        }
      }
    });
    if (threshold) {
      parts.push(
        svg('line', { x1: left, x2: W - right, y1: y(threshold), y2: y(threshold), stroke: '#a40e26', 'stroke-width': 2, 'stroke-dasharray': '6 4' }),
        svg('text', { x: W - right, y: y(threshold) - 5, 'text-anchor': 'end' }, `reflects at ${fmt(threshold)}`),
      );
    }
    parts.push(
      svg('rect', { x: left, y: 6, width: 12, height: 12, fill: '#54aeff' }),
      svg('text', { x: left + 16, y: 16 }, 'at start'),
      svg('rect', { x: left + 90, y: 6, width: 12, height: 12, fill: '#0550ae' }),
      svg('text', { x: left + 106, y: 16 }, 'at end (or now)'),
    );
    return svg(
      'svg',
      { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': 'gen-chart-title gen-chart-desc' },
      parts,
    );
  }

  function niceCeiling(v) {
    const power = 10 ** Math.floor(Math.log10(v));
    for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= v) return step * power;
    return 10 * power;
  }

  function renderDiffChoices(rows) {
    const a = $('diff-a');
    const b = $('diff-b');
    const keepA = a.value;
    const keepB = b.value;
    const options = () =>
      [...rows].reverse().map((g) => el('option', { value: g.generation }, `g${g.generation}${g.current ? ' (current)' : ''}`));
    a.replaceChildren(...options());
    b.replaceChildren(...options());
    const has = (v) => rows.some((g) => String(g.generation) === v);
    b.value = has(keepB) ? keepB : String(rows[rows.length - 1].generation);
    a.value = has(keepA) ? keepA : String(rows[Math.max(0, rows.length - 2)].generation);
    renderDiff();
  }

  function renderDiff() {
    const rows = state.generations ? state.generations.generations : [];
    const from = rows.find((g) => String(g.generation) === $('diff-a').value);
    const to = rows.find((g) => String(g.generation) === $('diff-b').value);
    const box = $('diff');
    if (!from || !to || rows.length < 2) {
      $('diff-summary').textContent = 'Only one generation so far: nothing to compare yet.';
      box.replaceChildren();
      return;
    }
    const ops = diffLines(lines(from.observations), lines(to.observations));
    const added = ops.filter((o) => o.op === 'add').length;
    const removed = ops.filter((o) => o.op === 'del').length;
    $('diff-summary').textContent =
      `g${from.generation} → g${to.generation}: ${added} line${added === 1 ? '' : 's'} added, ` +
      `${removed} removed, ${ops.length - added - removed} unchanged.`;
    box.replaceChildren(...collapse(ops));
  }

  // The diff compares what the Observer and the Reflector wrote: retrieval's group tags are bookkeeping.
  const lines = (text) =>
    (text || '').split('\n').filter((l) => l.trim() && !/^\s*<\/?observation-group\b/.test(l));

  // Longest common subsequence over lines (after the common prefix and suffix), as `same` / `del` / `add` ops.
  function diffLines(a, b) {
    let start = 0;
    while (start < a.length && start < b.length && a[start] === b[start]) start += 1;
    let endA = a.length;
    let endB = b.length;
    while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
      endA -= 1;
      endB -= 1;
    }
    const head = a.slice(0, start).map((line) => ({ op: 'same', line }));
    const tail = a.slice(endA).map((line) => ({ op: 'same', line }));
    const x = a.slice(start, endA);
    const y = b.slice(start, endB);
    const n = x.length;
    const m = y.length;
    const middle = [];
    if (n * m > DIFF_CELLS) {
      x.forEach((line) => middle.push({ op: 'del', line }));
      y.forEach((line) => middle.push({ op: 'add', line }));
    } else {
      const width = m + 1;
      const table = new Uint32Array((n + 1) * width);
      for (let i = n - 1; i >= 0; i -= 1) {
        for (let j = m - 1; j >= 0; j -= 1) {
          table[i * width + j] =
            x[i] === y[j] ? table[(i + 1) * width + j + 1] + 1 : Math.max(table[(i + 1) * width + j], table[i * width + j + 1]);
        }
      }
      let i = 0;
      let j = 0;
      while (i < n && j < m) {
        if (x[i] === y[j]) {
          middle.push({ op: 'same', line: x[i] });
          i += 1;
          j += 1;
        } else if (table[(i + 1) * width + j] >= table[i * width + j + 1]) {
          middle.push({ op: 'del', line: x[i] });
          i += 1;
        } else {
          middle.push({ op: 'add', line: y[j] });
          j += 1;
        }
      }
      while (i < n) middle.push({ op: 'del', line: x[i++] });
      while (j < m) middle.push({ op: 'add', line: y[j++] });
    }
    return [...head, ...middle, ...tail];
  }

  function collapse(ops) {
    const out = [];
    let run = [];
    const flush = () => {
      if (run.length > 6) {
        out.push(...run.slice(0, 2).map(sameLine));
        out.push(el('span', { class: 'd skipped' }, `… ${run.length - 4} unchanged lines …`));
        out.push(...run.slice(-2).map(sameLine));
      } else {
        out.push(...run.map(sameLine));
      }
      run = [];
    };
    for (const o of ops) {
      if (o.op === 'same') {
        run.push(o.line);
        continue;
      }
      flush();
      out.push(
        o.op === 'add'
          ? el('ins', { class: 'd', dataset: { op: 'add' } }, `+ ${o.line}`)
          : el('del', { class: 'd', dataset: { op: 'del' } }, `− ${o.line}`),
      );
    }
    flush();
    return out;
  }

  const sameLine = (line) => el('span', { class: 'd same' }, `  ${line}`);

  // -- recall -------------------------------------------------------------------------------------------------------
  async function recall(event) {
    if (event) event.preventDefault();
    const out = $('recall-out');
    const form = $('recall-form');
    const values = Object.fromEntries(new FormData(form).entries());
    const body = { resourceId: state.resourceId, threadId: state.threadId, mode: values.mode, detail: values.detail };
    if (values.query) body.query = values.query;
    if (values.cursor) body.cursor = values.cursor;
    if (values.page !== '') body.page = Number(values.page);
    if (values.limit !== '') body.limit = Number(values.limit);
    out.replaceChildren(el('p', { class: 'muted' }, 'Recalling…'));
    let answer;
    try {
      answer = await api('recall', { method: 'POST', body });
    } catch (error) {
      out.replaceChildren(el('p', { class: 'error-text', role: 'alert', id: 'recall-error' }, ...apiProblem(error, 'the recall')));
      return;
    }
    renderRecall(body, answer);
  }

  function renderRecall(sent, answer) {
    const out = $('recall-out');
    const text = answer.messages ?? answer.threads ?? answer.results ?? answer.text ?? '';
    const facts = [];
    if (answer.count !== undefined) facts.push(`${answer.count} item${answer.count === 1 ? '' : 's'}`);
    if (answer.page !== undefined) facts.push(`page ${answer.page}`);
    if (answer.cursor) facts.push(`cursor ${answer.cursor}`);
    if (answer.truncated) facts.push(`truncated at token offset ${answer.tokenOffset}`);
    const pager = el('div', { class: 'row' });
    const move = (page, cursor) => {
      $('recall-page').value = String(page);
      if (cursor) $('recall-cursor').value = cursor;
      recall();
    };
    if (sent.mode === 'messages' && answer.page !== undefined) {
      const previous = answer.page - 1 === 0 ? -1 : answer.page - 1;
      const next = answer.page + 1 === 0 ? 1 : answer.page + 1;
      pager.append(
        button('Previous page', !answer.hasPrevPage, () => move(previous, answer.cursor)),
        button('Next page', !answer.hasNextPage, () => move(next, answer.cursor)),
      );
    } else if (sent.mode === 'threads') {
      pager.append(
        button('Previous page', !(answer.page > 0), () => move(answer.page - 1)),
        button('Next page', !answer.hasMore, () => move(answer.page + 1)),
      );
    }
    out.replaceChildren(
      el('p', { class: 'muted', id: 'recall-facts' }, facts.join(' · ')),
      pager,
      el('pre', { id: 'recall-text' }, text || '(nothing)'),
    );
  }

  function button(label, disabled, onClick) {
    const b = el('button', { type: 'button', disabled }, label);
    b.addEventListener('click', onClick);
    return b;
  }

  // -- tabs ---------------------------------------------------------------------------------------------------------
  const VIEWS = ['memory', 'generations', 'messages', 'failures', 'recall'];

  function setView(view, focusTab = false) {
    if (!VIEWS.includes(view)) view = 'memory';
    state.view = view;
    for (const name of VIEWS) {
      const tab = $(`tab-${name}`);
      const selected = name === view;
      tab.setAttribute('aria-selected', String(selected));
      tab.tabIndex = selected ? 0 : -1;
      $(`view-${name}`).hidden = !selected;
      if (selected && focusTab) tab.focus();
    }
    writeUrl();
    if (view === 'generations' && state.memory) {
      loadGenerations().catch((error) => showAlert(apiProblem(error, 'to list the generations')));
    }
  }

  function onTabKey(event) {
    const index = VIEWS.indexOf(state.view);
    const moves = { ArrowRight: index + 1, ArrowLeft: index - 1, Home: 0, End: VIEWS.length - 1 };
    if (!(event.key in moves)) return;
    event.preventDefault();
    setView(VIEWS[(moves[event.key] + VIEWS.length) % VIEWS.length], true);
  }

  // -- start ----------------------------------------------------------------------------------------------------------
  async function loadReasons() {
    try {
      const response = await fetch(new URL('failure-reasons.json', assetBase), { cache: 'no-store' });
      const doc = await response.json();
      for (const reason of doc.reasons) state.reasons.set(reason.reason, reason);
    } catch (error) {
      /* failures still show their reason code and message */
    }
  }

  function start() {
    $('pick').addEventListener('submit', (event) => {
      event.preventDefault();
      const resourceId = $('resource').value.trim();
      if (resourceId) openResource(resourceId, null);
    });
    $('thread').addEventListener('change', (event) => {
      if (event.target.value) selectThread(event.target.value);
    });
    $('pause').addEventListener('click', () => {
      state.paused = !state.paused;
      $('pause').setAttribute('aria-pressed', String(state.paused));
      $('pause').textContent = state.paused ? 'Resume updates' : 'Pause updates';
      setLive(state.paused ? 'Paused' : 'Live');
      if (!state.paused && state.resourceId) poll();
    });
    for (const name of VIEWS) $(`tab-${name}`).addEventListener('click', () => setView(name));
    document.querySelector('[role=tablist]').addEventListener('keydown', onTabKey);
    $('search').addEventListener('input', applyFilter);
    $('msg-newest').addEventListener('click', () => gotoMessages(0));
    $('msg-newer').addEventListener('click', () => gotoMessages(state.msgPage - 1));
    $('msg-older').addEventListener('click', () => gotoMessages(state.msgPage + 1));
    $('diff-a').addEventListener('change', renderDiff);
    $('diff-b').addEventListener('change', renderDiff);
    $('recall-form').addEventListener('submit', recall);
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && state.resourceId && !state.paused) poll();
    });

    const params = new URLSearchParams(location.search);
    state.view = VIEWS.includes(params.get('view')) ? params.get('view') : 'memory';
    setView(state.view);
    loadReasons().then(() => {
      if (state.memory) renderFailures();
    });
    const resourceId = (params.get('resourceId') || '').trim();
    if (!resourceId) {
      setState('idle');
      $('resource').focus();
      return;
    }
    openResource(resourceId, (params.get('threadId') || '').trim() || null);
  }

  start();
})();

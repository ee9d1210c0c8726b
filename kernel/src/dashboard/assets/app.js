// HiveKernel dashboard: a single-page client of the kernel's JSON API.
// Every string that comes from the server reaches the page as text, never as markup.
'use strict';

(() => {
  const ROW_H = 32;          // tree row height, px (must match .tree-row in app.css)
  const HEAD_H = 30;         // tree header height, px (must match .tree-head)
  const OVERSCAN = 10;       // rows rendered above and below the visible ones
  const BIG_FANOUT = 50;     // subtrees with more children start collapsed
  const EVENTS_KEPT = 2000;  // events held in memory for the timeline
  const EVENTS_SHOWN = 300;  // rows the timeline renders at most
  const REFRESH_GAP = 1000;  // at most one GetProcess per process per this many ms
  const REFRESH_PARALLEL = 6;

  const state = {
    session: null,                 // {scope, pid, version, node}
    procs: new Map(),              // pid -> {pid, info, parent, kids: [pid], collapsed}
    roots: [],                     // pids without a known parent
    tree: { rows: [], dirty: true, frame: 0, selected: 0, filter: '', scrollTop: 0,
            loading: false, again: false, pending: [], loaded: false, error: '', matches: 0 },
    events: { list: [], lastSeq: 0, history: null },   // oldest first, capped; history: the watch that read the kept log
    inbox: new Set(),              // ids of pending inbox requests (for the nav badge)
    gone: new Set(),               // reaped pids: a late GetProcess answer must not bring one back
    refresh: { last: new Map(), timers: new Map(), queue: [], queued: new Set(), inflight: 0 },
    live: null,                    // the kernel event stream
    view: null,                    // the mounted view's context
    flashRoutes: 0,
  };

  // ---- DOM helpers

  const $ = (id) => document.getElementById(id);

  function add(el, kids) {
    for (const k of kids.flat(Infinity)) {
      if (k == null || k === false) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }

  function setAttrs(el, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'class') el.setAttribute('class', v);
      else if (k === 'text') el.textContent = v;
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }

  const put = (el, ...kids) => add(el, kids);
  const fill = (el, ...kids) => { el.replaceChildren(); return add(el, kids); };

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    return add(el, kids);
  }

  const note = (...kids) => h('p', { class: 'muted' }, kids);
  const dim = (...kids) => h('span', { class: 'muted' }, kids);
  const numCell = (...kids) => h('td', { class: 'num' }, kids);
  const viewHead = (title, ...more) => h('div', { class: 'view-head' }, h('h1', { tabindex: '-1' }, title), more);

  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    setAttrs(el, attrs);
    return add(el, kids);
  }

  // ---- formatting

  const num = (v) => Number(v) || 0;
  const fmtInt = (v) => num(v).toLocaleString();
  const compactFmt = new Intl.NumberFormat(undefined, { notation: 'compact', maximumFractionDigits: 1 });
  const fmtCompact = (v) => compactFmt.format(num(v));
  function fmtUsd(v) {
    const n = num(v);
    if (n > 0 && n < 0.0001) return '<$0.0001';
    return '$' + (n === 0 ? '0.00' : n < 0.01 ? n.toFixed(4) : n.toFixed(2));
  }
  function fmtDur(ms) {
    const n = num(ms);
    if (n < 1000) return n + ' ms';
    if (n < 60000) return (n / 1000).toFixed(n < 10000 ? 2 : 1) + ' s';
    const m = Math.floor(n / 60000), s = Math.round((n % 60000) / 1000);
    if (m < 60) return `${m} min ${s} s`;
    return `${Math.floor(m / 60)} h ${m % 60} min`;
  }
  function relAge(ms) {
    const d = Date.now() - ms, a = Math.abs(d) / 1000;
    const t = a < 45 ? Math.round(a) + ' s' : a < 2700 ? Math.round(a / 60) + ' min'
      : a < 64800 ? Math.round(a / 3600) + ' h' : Math.round(a / 86400) + ' d';
    return d < 0 ? 'in ' + t : t + ' ago';
  }
  function localTime(ms, short) {
    const dt = new Date(ms);
    if (short || dt.toDateString() === new Date().toDateString()) return dt.toLocaleTimeString();
    return dt.toLocaleString();
  }
  // A <time> element with local time and relative age, kept fresh by the clock tick.
  function timeEl(ms, opts = {}) {
    if (!num(ms)) return dim(opts.none || '—');
    const el = h('time', { datetime: new Date(ms).toISOString(), title: new Date(ms).toLocaleString(), 'data-ms': ms });
    if (opts.plain) { el.textContent = localTime(ms, true); return el; }
    el.className = 'rel';
    el.textContent = `${localTime(ms)} (${relAge(ms)})`;
    return el;
  }
  function tickClock() {
    for (const el of document.querySelectorAll('time.rel')) {
      const ms = Number(el.getAttribute('data-ms'));
      el.textContent = `${localTime(ms)} (${relAge(ms)})`;
    }
  }

  // Enum names arrive as e.g. "PROCESS_STATE_RUNNING": shown as "running".
  function enumText(v, prefix) {
    if (v == null || v === '') return '—';
    const s = String(v);
    return (s.startsWith(prefix) ? s.slice(prefix.length) : s).toLowerCase();
  }
  const stateText = (v) => enumText(v, 'PROCESS_STATE_');
  const roleText = (v) => enumText(v, 'ROLE_');
  const tierText = (v) => enumText(v, 'COGNITIVE_TIER_');

  function stateBadge(v, id) {
    const t = stateText(v);
    return h('span', { class: 'state state-' + t.replace(/[^a-z]/g, ''), id }, t);
  }

  function parseJson(s) {
    if (typeof s !== 'string' || !s) return {};
    try { const v = JSON.parse(s); return v && typeof v === 'object' ? v : {}; } catch { return {}; }
  }
  function pretty(s) {
    if (typeof s !== 'string') return JSON.stringify(s, null, 2);
    try { return JSON.stringify(JSON.parse(s), null, 2); } catch { return s; }
  }
  const tokensOf = (u) => (u ? num(u.promptTokens) + num(u.completionTokens) : 0);
  const isTraceId = (s) => typeof s === 'string' && /^[0-9a-fA-F]{8,64}$/.test(s);

  function pidLink(pid, withName) {
    const p = num(pid);
    if (!p) return dim('—');
    const n = state.procs.get(p);
    const label = withName && n && n.info.name ? `${p} ${n.info.name}` : String(p);
    return h('a', { href: '#/proc/' + p }, label);
  }
  function traceLink(id, full) {
    if (!id) return dim('—');
    if (!isTraceId(id)) return h('code', null, id);
    return h('a', { href: '#/trace/' + id, title: 'Trace ' + id, class: 'mono' }, full ? id : id.slice(0, 8) + '…');
  }
  function errorLine(msg, id) {
    return h('p', { class: 'error', role: 'alert', id }, msg);
  }
  function kv(pairs) {
    const dl = h('dl', { class: 'kv' });
    for (const [k, v] of pairs) {
      if (v === undefined) continue;
      put(dl, h('dt', null, k), h('dd', null, v === '' || v === null ? dim('—') : v));
    }
    return dl;
  }
  function table(headers, rows, attrs) {
    return h('div', { class: 'table-wrap' },
      h('table', attrs,
        h('thead', null, h('tr', null, headers.map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', null, rows)));
  }
  function section(title, id, ...kids) {
    return h('section', { class: 'card', id, 'aria-labelledby': id ? id + '-h' : null },
      h('h2', { id: id ? id + '-h' : null }, title), kids);
  }
  function flash(msg) {
    const el = $('flash');
    el.textContent = msg;
    state.flashRoutes = msg ? 2 : 0;
  }

  // Runs fn at most once per `ms`, the last call always taking effect.
  function throttle(fn, ms) {
    let last = 0, timer = 0;
    const run = () => { timer = 0; last = Date.now(); fn(); };
    const t = () => {
      if (timer) return;
      const wait = last + ms - Date.now();
      if (wait <= 0) run(); else timer = setTimeout(run, wait);
    };
    t.cancel = () => { clearTimeout(timer); timer = 0; };
    return t;
  }

  const canAct = () => !!state.session && (state.session.scope === 'operate' || state.session.scope === 'admin');

  // ---- server access

  class ApiError extends Error {
    constructor(message, code, status) { super(message); this.code = code || 'UNKNOWN'; this.status = status || 0; }
  }

  async function request(path, init, noSessionCheck) {
    let res;
    try {
      res = await fetch(path, Object.assign({ credentials: 'same-origin', cache: 'no-store' }, init));
    } catch (err) {
      throw new ApiError('The kernel cannot be reached: ' + err.message, 'UNAVAILABLE', 0);
    }
    if (res.status === 401 && !noSessionCheck) sessionEnded();
    if (!res.ok) {
      let body = null;
      try { body = await res.json(); } catch { /* not JSON */ }
      const msg = body && typeof body.message === 'string' && body.message
        ? body.message : `The request failed (HTTP ${res.status}${res.statusText ? ' ' + res.statusText : ''}).`;
      throw new ApiError(msg, body && body.code, res.status);
    }
    if (res.status === 204) return null;
    const text = await res.text();
    return text ? JSON.parse(text) : null;
  }

  // The session key: answered once, at login, and kept in this tab's session storage
  // (which no other origin, other ports of this host included, can read). Every API
  // call carries it; the session cookie alone is not enough.
  const KEY = 'hivekernel.session-key';
  function sessionKey() {
    try { return sessionStorage.getItem(KEY) || ''; } catch { return ''; }
  }
  function keepSessionKey(key) {
    try { if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY); } catch { /* storage off */ }
  }

  function csrfHeaders() {
    return { 'Content-Type': 'application/json', 'X-CSRF-Token': sessionKey() };
  }

  // One RPC: POST /api/rpc/<method> with the request message as JSON.
  function api(method, body) {
    return request('/api/rpc/' + method, { method: 'POST', headers: csrfHeaders(), body: JSON.stringify(body || {}) });
  }

  // Whether the session is still good (a kernel that cannot be reached counts as good:
  // the caller keeps retrying). A 401 sends the user to the login view.
  async function checkSession() {
    try {
      const res = await fetch('/api/session', { credentials: 'same-origin', cache: 'no-store', headers: { 'X-CSRF-Token': sessionKey() } });
      if (res.status === 401) { sessionEnded(); return false; }
      return true;
    } catch { return true; }
  }

  // One server stream over SSE. onMessage gets each message; hooks: onOpen, onEnd (the
  // stream finished), onError(ApiError) (the server ended it with an error), onDrop (the
  // connection was lost). Returns {close}.
  // A live stream's address with a fresh ticket: EventSource cannot send the session
  // key, so the page trades the key for a single-use ticket just before it opens one.
  async function ticketed(base) {
    const made = await request('/api/ticket', { method: 'POST', headers: csrfHeaders(), body: '{}' });
    return base + '&ticket=' + encodeURIComponent(made.ticket);
  }

  function watch(method, req, onMessage, hooks = {}) {
    const base = '/api/watch/' + method + '?q=' + encodeURIComponent(JSON.stringify(req || {}));
    let es = null;
    let closed = false;
    const close = () => { if (!closed) { closed = true; if (es) es.close(); } };
    ticketed(base).then((url) => {
      if (closed) return;
      es = new EventSource(url);
      es.addEventListener('open', () => { if (!closed && hooks.onOpen) hooks.onOpen(); });
      // Each message carries one or more of the stream's messages, as a JSON array.
      es.addEventListener('message', (e) => {
        if (closed) return;
        let batch;
        try { batch = JSON.parse(e.data); } catch { return; }
        for (const msg of Array.isArray(batch) ? batch : [batch]) {
          if (closed) return;
          onMessage(msg);
        }
      });
      es.addEventListener('end', () => {
        if (closed) return;
        close();
        if (hooks.onEnd) hooks.onEnd();
      });
      // Both the server's `event: error` (with data) and a lost connection (without) land here.
      es.addEventListener('error', (e) => {
        if (closed) return;
        close();
        if (typeof e.data === 'string' && e.data) {
          const body = parseJson(e.data);
          const err = new ApiError(body.message || e.data, body.code, 0);
          if (err.code === 'UNAUTHENTICATED') { checkSession(); return; }
          if (hooks.onError) hooks.onError(err);
        } else {
          probe(base).then((refusal) => {
            if (refusal === null) { if (hooks.onDrop) hooks.onDrop(); } else if (refusal && hooks.onError) hooks.onError(refusal);
          });
        }
      });
    }, (err) => {
      // No ticket: the session has ended (the login is shown), the kernel cannot be
      // reached (try again), or it refused.
      if (closed) return;
      close();
      if (err.status === 401) return;
      if (err.status === 0 || RETRYABLE.has(err.code)) { if (hooks.onDrop) hooks.onDrop(); } else if (hooks.onError) hooks.onError(err);
    });
    return { close };
  }

  // Why a stream failed, which EventSource cannot tell: null when it may simply be
  // opened again (the connection dropped), false when the session has ended, else the
  // server's refusal.
  async function probe(base) {
    const ac = new AbortController();
    try {
      const url = await ticketed(base);
      const res = await fetch(url, { credentials: 'same-origin', cache: 'no-store', signal: ac.signal });
      if (res.ok) { ac.abort(); return null; }
      if (res.status === 401) { sessionEnded(); return false; }
      let body = {};
      try { body = await res.json(); } catch { /* not JSON */ }
      return new ApiError(body.message || `The stream was refused (HTTP ${res.status}).`, body.code, res.status);
    } catch (err) {
      if (!(err instanceof ApiError) || err.status === 0) return null;
      return err.status === 401 ? false : err;
    }
  }

  const RETRYABLE = new Set(['UNAVAILABLE', 'ABORTED', 'INTERNAL', 'UNKNOWN', 'DEADLINE_EXCEEDED', 'RESOURCE_EXHAUSTED']);

  // A watch that reopens itself after a lost connection (or a transient server error),
  // backing off from 1 s to 30 s. makeReq() builds the request for each (re)connection.
  // hooks.onEnd(retry): the stream finished (default: reconnect). hooks.onStatus(text).
  function liveWatch(method, makeReq, onMessage, hooks = {}) {
    let current = null, timer = 0, delay = 1000, stopped = false;
    const status = (s) => { if (hooks.onStatus) hooks.onStatus(s); };
    const retry = () => {
      if (stopped || timer) return;
      status('reconnecting');
      timer = setTimeout(open, delay);
      delay = Math.min(delay * 2, 30000);
    };
    function open() {
      timer = 0;
      if (stopped) return;
      current = watch(method, makeReq(), (msg) => { delay = 1000; onMessage(msg); }, {
        onOpen: () => { status('live'); if (hooks.onOpen) hooks.onOpen(); },
        onEnd: () => { if (hooks.onEnd) hooks.onEnd(retry); else retry(); },
        onError: (err) => {
          if (RETRYABLE.has(err.code)) retry();
          else { status('stopped'); if (hooks.onError) hooks.onError(err); }
        },
        onDrop: retry,
      });
    }
    open();
    return { close() { stopped = true; clearTimeout(timer); if (current) current.close(); } };
  }

  // ---- the process tree (data)

  function treeRootPid() { return state.session && state.session.pid ? state.session.pid : 1; }

  function markTree(structural) {
    if (structural) state.tree.dirty = true;
    if (!state.tree.frame) state.tree.frame = requestAnimationFrame(treeFrame);
  }

  function upsert(info) {
    const pid = num(info.pid);
    if (!pid) return null;
    let n = state.procs.get(pid);
    if (n) {
      n.info = info;
      markTree(state.tree.filter !== '');
      return n;
    }
    n = { pid, info, parent: 0, kids: [], collapsed: num(info.children) > BIG_FANOUT };
    state.procs.set(pid, n);
    const ppid = num(info.ppid);
    const p = ppid !== pid ? state.procs.get(ppid) : null;
    if (p) { n.parent = ppid; p.kids.push(pid); } else state.roots.push(pid);
    // Processes seen before their parent hang from the roots until it shows up.
    if (state.roots.length > 1) {
      for (const r of state.roots.slice()) {
        const o = state.procs.get(r);
        if (r !== pid && o && num(o.info.ppid) === pid) {
          state.roots.splice(state.roots.indexOf(r), 1);
          o.parent = pid;
          n.kids.push(r);
        }
      }
    }
    markTree(true);
    return n;
  }

  function removeSubtree(pid) {
    const n = state.procs.get(pid);
    if (!n) return;
    const list = n.parent ? (state.procs.get(n.parent) || { kids: [] }).kids : state.roots;
    const i = list.indexOf(pid);
    if (i >= 0) list.splice(i, 1);
    const stack = [pid];
    while (stack.length) {
      const p = stack.pop(), m = state.procs.get(p);
      if (!m) continue;
      stack.push(...m.kids);
      state.procs.delete(p);
      state.gone.add(p);
      state.refresh.last.delete(p);
      if (state.tree.selected === p) state.tree.selected = n.parent;
    }
    markTree(true);
  }

  // Adds a model call's usage to every ancestor's subtree usage, until their next refresh.
  function addUsageUpwards(pid, d) {
    const n = state.procs.get(pid);
    for (let p = n && state.procs.get(n.parent); p; p = state.procs.get(p.parent)) {
      const u = p.info.subtreeUsage || (p.info.subtreeUsage = { calls: 0, promptTokens: 0, completionTokens: 0, costUsd: 0 });
      u.calls = num(u.calls) + 1;
      u.promptTokens = num(u.promptTokens) + num(d.prompt_tokens);
      u.completionTokens = num(u.completionTokens) + num(d.completion_tokens);
      u.costUsd = num(u.costUsd) + num(d.cost_nano_usd) / 1e9;
    }
  }

  async function loadTree() {
    const t = state.tree;
    if (t.loading) { t.again = true; return; }
    t.loading = true;
    t.again = false;
    t.error = '';
    try {
      const batches = await api('ListProcesses', { root: treeRootPid(), batchSize: 1000 });
      if (!state.session) return;
      const old = state.procs;
      state.procs = new Map();
      state.roots = [];
      for (const b of batches || []) {
        for (const info of (b && b.processes) || []) {
          const n = upsert(info);
          const was = n && old.get(n.pid);
          if (was) n.collapsed = was.collapsed;
        }
      }
      if (!old.size) for (const n of state.procs.values()) n.collapsed = n.kids.length > BIG_FANOUT;
      if (!t.selected || !state.procs.has(t.selected)) t.selected = state.roots[0] || 0;
      t.loaded = true;
    } catch (err) {
      t.error = err.message;
    } finally {
      t.loading = false;
      const pending = t.pending;
      t.pending = [];
      for (const ev of pending) applyToTree(ev);
      markTree(true);
      if (t.again) loadTree();
    }
  }
  const loadTreeSoon = throttle(loadTree, 2000);

  // GetProcess for one process, at most once per REFRESH_GAP, a few at a time.
  function refreshProc(pid) {
    const r = state.refresh;
    if (!pid || r.timers.has(pid) || r.queued.has(pid)) return;
    const wait = (r.last.get(pid) || 0) + REFRESH_GAP - Date.now();
    if (wait > 0) {
      r.timers.set(pid, setTimeout(() => { r.timers.delete(pid); enqueueRefresh(pid); }, wait));
    } else enqueueRefresh(pid);
  }
  function enqueueRefresh(pid) {
    const r = state.refresh;
    r.queued.add(pid);
    r.queue.push(pid);
    pumpRefresh();
  }
  function pumpRefresh() {
    const r = state.refresh;
    while (r.inflight < REFRESH_PARALLEL && r.queue.length) {
      const pid = r.queue.shift();
      r.queued.delete(pid);
      r.last.set(pid, Date.now());
      r.inflight++;
      api('GetProcess', { pid })
        .then((info) => {
          if (!state.session || !info || state.gone.has(pid)) return;
          // Only processes of the tree held (or new children of one) join it.
          if (state.procs.has(pid) || state.procs.has(num(info.ppid))) upsert(info);
          if (state.view && state.view.onProc) state.view.onProc(info);
        }, (err) => {
          if (err.code === 'NOT_FOUND') removeSubtree(pid);
        })
        .finally(() => { r.inflight--; pumpRefresh(); });
    }
  }

  // What one kernel event changes in the tree.
  function applyToTree(ev) {
    const d = ev.d, pid = num(ev.pid);
    switch (ev.type) {
      case 'spawned': {
        const p = state.procs.get(num(d.ppid));
        if (p && !state.procs.has(pid)) p.info.children = num(p.info.children) + 1;
        refreshProc(pid);
        break;
      }
      case 'exited': {
        const n = state.procs.get(pid);
        if (n) {
          n.info.state = 'PROCESS_STATE_ZOMBIE';
          n.info.exit = { pid, exitCode: d.exit_code, reason: d.reason, exitedAtUnixMs: ev.atUnixMs };
          markTree(state.tree.filter !== '');
        }
        refreshProc(pid);
        break;
      }
      case 'reaped': {
        const n = state.procs.get(pid), p = n && state.procs.get(n.parent);
        if (p) p.info.children = Math.max(0, num(p.info.children) - 1);
        removeSubtree(pid);
        break;
      }
      case 'llm_call':
        addUsageUpwards(pid, d);
        refreshProc(pid);
        break;
      case 'restarted': case 'task_finished': case 'tool_call':
      case 'approval_requested': case 'approval_resolved':
        refreshProc(pid);
        break;
      case 'lagged': case 'pruned':
        loadTreeSoon();
        break;
      default:
    }
  }

  // ---- the kernel event stream

  function onKernelEvent(ev) {
    if (!ev || typeof ev !== 'object') return;
    ev.d = parseJson(ev.detail);
    const seq = num(ev.seq);
    if (seq > state.events.lastSeq) state.events.lastSeq = seq;
    if (ev.type !== 'replay_done' && !(seq && seq <= (state.events.historySeq || 0) && state.events.list.some((e) => num(e.seq) === seq))) {
      const list = state.events.list;
      list.push(ev);
      if (list.length > EVENTS_KEPT + 200) list.splice(0, list.length - EVENTS_KEPT);
    }
    if (ev.type === 'approval_requested') { state.inbox.add(num(ev.d.id)); showInboxBadge(); }
    if (ev.type === 'approval_resolved') { state.inbox.delete(num(ev.d.id)); showInboxBadge(); }
    if (state.tree.loading) state.tree.pending.push(ev); else applyToTree(ev);
    if (state.view && state.view.onEvent) state.view.onEvent(ev);
  }

  function setConn(s) {
    const el = $('conn-status');
    if (!el) return;
    el.textContent = s === 'live' ? '● live' : s === 'reconnecting' ? '○ reconnecting…' : '○ ' + s;
    el.className = 'conn conn-' + (s === 'live' ? 'live' : 'down');
  }

  function startLive() {
    let treeAsked = false;
    const askTree = () => { if (!treeAsked) { treeAsked = true; loadTree(); } };
    // The tree is listed once the stream is open, so no change falls between the two.
    const fallback = setTimeout(askTree, 1500);
    state.live = liveWatch('SubscribeEvents',
      () => (state.events.lastSeq > 0 ? { replay: true, sinceSeq: state.events.lastSeq } : {}),
      onKernelEvent, {
        onStatus: setConn,
        onOpen: () => {
          clearTimeout(fallback);
          if (!treeAsked) askTree();
          else if (!state.events.lastSeq) loadTreeSoon();
        },
        onError: (err) => setConn('stopped: ' + err.message),
      });
  }

  async function loadInboxCount() {
    try {
      const r = await api('ListRequests', {});
      state.inbox = new Set(((r && r.requests) || []).map((q) => num(q.id)));
      showInboxBadge();
    } catch { /* the badge stays hidden */ }
  }
  function showInboxBadge() {
    const b = $('inbox-badge');
    if (!b) return;
    b.hidden = state.inbox.size === 0;
    b.textContent = String(state.inbox.size);
    b.setAttribute('aria-label', state.inbox.size + ' pending');
  }

  // ---- tree view

  function flattenTree() {
    const t = state.tree, rows = [];
    const q = t.filter.trim().toLowerCase();
    let show = null;
    t.matches = 0;
    if (q) {
      show = new Set();
      for (const n of state.procs.values()) {
        if (!procMatches(n, q)) continue;
        t.matches++;
        for (let p = n; p && !show.has(p.pid); p = state.procs.get(p.parent)) show.add(p.pid);
      }
    }
    const stack = [];
    for (let i = state.roots.length - 1; i >= 0; i--) stack.push(state.roots[i], 0);
    while (stack.length) {
      const depth = stack.pop(), pid = stack.pop();
      const n = state.procs.get(pid);
      if (!n || (show && !show.has(pid))) continue;
      // Exited processes (zombies until reaped) are shown only when asked, as `ps -a` does.
      if (!t.showExited && isExited(n.info.state)) continue;
      rows.push({ pid, depth });
      if (n.kids.length && (show || !n.collapsed)) {
        for (let i = n.kids.length - 1; i >= 0; i--) stack.push(n.kids[i], depth + 1);
      }
    }
    t.rows = rows;
  }

  function isExited(s) {
    return s === 'PROCESS_STATE_ZOMBIE' || s === 'PROCESS_STATE_DEAD';
  }

  function procMatches(n, q) {
    const i = n.info;
    if (/^\d+$/.test(q)) return String(n.pid) === q;
    return String(i.name || '').toLowerCase().includes(q) || roleText(i.role).includes(q)
      || stateText(i.state).includes(q) || String(n.pid) === q;
  }

  function treeFrame() {
    const t = state.tree;
    t.frame = 0;
    if (t.dirty) { flattenTree(); t.dirty = false; }
    const count = $('tree-count');
    if (count) {
      const total = state.procs.size;
      count.textContent = `${total.toLocaleString()} ${total === 1 ? 'process' : 'processes'}`
        + (t.filter.trim() ? ` (${t.matches.toLocaleString()} matching)` : '');
    }
    const status = $('tree-status');
    if (status) {
      status.textContent = t.error ? 'The process list could not be loaded: ' + t.error
        : !t.loaded ? 'Loading processes…' : !t.rows.length ? (t.filter.trim() ? 'No process matches the filter.' : 'No processes.') : '';
      status.className = t.error ? 'error' : 'muted';
    }
    renderTreeRows();
  }

  function renderTreeRows() {
    const box = $('tree');
    if (!box) return;
    const t = state.tree, rows = t.rows;
    const spacer = box.querySelector('.tree-spacer'), layer = box.querySelector('.tree-rows');
    spacer.style.height = HEAD_H + rows.length * ROW_H + 'px';
    const top = Math.max(0, box.scrollTop - HEAD_H);
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(rows.length, Math.ceil((top + box.clientHeight) / ROW_H) + OVERSCAN);
    const filtering = t.filter.trim() !== '';
    const frag = document.createDocumentFragment();
    for (let i = first; i < last; i++) put(frag, treeRow(rows[i], i, filtering));
    fill(layer, frag);
    const selIndex = rows.findIndex((r) => r.pid === t.selected);
    if (selIndex >= first && selIndex < last) box.setAttribute('aria-activedescendant', 'proc-row-' + t.selected);
    else box.removeAttribute('aria-activedescendant');
  }

  function treeRow(r, index, filtering) {
    const n = state.procs.get(r.pid), info = n.info;
    const selected = state.tree.selected === r.pid;
    const hasKids = n.kids.length > 0;
    const open = hasKids && (filtering || !n.collapsed);
    const row = h('div', {
      class: 'tree-row' + (selected ? ' selected' : ''), role: 'treeitem', id: 'proc-row-' + r.pid,
      'data-testid': 'proc-row', 'data-pid': r.pid, 'aria-level': r.depth + 1,
      'aria-selected': selected ? 'true' : 'false', 'aria-expanded': hasKids ? String(open) : null,
    });
    row.style.top = index * ROW_H + 'px';
    const first = h('span', { class: 'c-pid' });
    first.style.paddingLeft = Math.min(r.depth, 40) * 14 + 'px';
    if (hasKids) {
      put(first, h('button', {
        type: 'button', class: 'toggle', tabindex: '-1', 'data-toggle': r.pid,
        'aria-label': (open ? 'Collapse ' : 'Expand ') + r.pid, title: `${n.kids.length} children`,
      }, open ? '▾' : '▸'));
    } else put(first, h('span', { class: 'toggle-space', 'aria-hidden': 'true' }));
    put(first, String(r.pid));
    const u = info.usage;
    put(row, first,
      h('span', { class: 'c-name' }, h('a', { href: '#/proc/' + r.pid, tabindex: '-1' }, info.name || '(unnamed)'),
        hasKids && !open ? dim(` (+${n.kids.length})`) : null,
        info.node ? dim(' @' + info.node) : null),
      h('span', { class: 'c-role' }, roleText(info.role)),
      h('span', { class: 'c-state' }, stateBadge(info.state)),
      h('span', { class: 'c-model' }, info.model || ''),
      h('span', { class: 'c-num', title: 'Mailbox depth' }, fmtInt(info.mailboxLen)),
      h('span', { class: 'c-num', title: u ? `${fmtInt(u.promptTokens)} prompt + ${fmtInt(u.completionTokens)} completion` : null }, fmtInt(tokensOf(u))));
    return row;
  }

  function selectRow(pid, reveal) {
    state.tree.selected = pid;
    if (reveal) {
      const box = $('tree');
      const i = state.tree.rows.findIndex((r) => r.pid === pid);
      if (box && i >= 0) {
        const top = HEAD_H + i * ROW_H;
        if (top - HEAD_H < box.scrollTop) box.scrollTop = top - HEAD_H;
        else if (top + ROW_H > box.scrollTop + box.clientHeight) box.scrollTop = top + ROW_H - box.clientHeight;
      }
    }
    markTree(false);
  }

  function toggleNode(pid, open) {
    const n = state.procs.get(pid);
    if (!n || !n.kids.length) return;
    n.collapsed = open === undefined ? !n.collapsed : !open;
    markTree(true);
  }

  function treeKey(e) {
    const t = state.tree, rows = t.rows;
    if (!rows.length) return;
    let i = rows.findIndex((r) => r.pid === t.selected);
    const n = state.procs.get(t.selected);
    const filtering = t.filter.trim() !== '';
    const page = Math.max(1, Math.floor(($('tree').clientHeight - HEAD_H) / ROW_H) - 1);
    switch (e.key) {
      case 'ArrowDown': i = i < 0 ? 0 : Math.min(rows.length - 1, i + 1); break;
      case 'ArrowUp': i = i < 0 ? 0 : Math.max(0, i - 1); break;
      case 'PageDown': i = Math.min(rows.length - 1, Math.max(i, 0) + page); break;
      case 'PageUp': i = Math.max(0, i - page); break;
      case 'Home': i = 0; break;
      case 'End': i = rows.length - 1; break;
      case 'ArrowRight':
        if (n && n.kids.length && n.collapsed && !filtering) { toggleNode(n.pid, true); e.preventDefault(); return; }
        if (n && n.kids.length && i >= 0 && i + 1 < rows.length) i += 1;
        break;
      case 'ArrowLeft':
        if (n && n.kids.length && !n.collapsed && !filtering) { toggleNode(n.pid, false); e.preventDefault(); return; }
        if (n && n.parent) { const j = rows.findIndex((r) => r.pid === n.parent); if (j >= 0) i = j; }
        break;
      case 'Enter':
        if (t.selected) location.hash = '#/proc/' + t.selected;
        e.preventDefault();
        return;
      default: return;
    }
    e.preventDefault();
    if (i >= 0) selectRow(rows[i].pid, true);
  }

  function viewTree(ctx) {
    const t = state.tree;
    const filter = h('input', { id: 'tree-filter', type: 'search', value: t.filter, placeholder: 'name, role, state or PID', autocomplete: 'off' });
    filter.addEventListener('input', () => { t.filter = filter.value; t.scrollTop = 0; $('tree').scrollTop = 0; markTree(true); });
    const exited = h('input', { id: 'tree-exited', type: 'checkbox' });
    exited.checked = !!t.showExited;
    exited.addEventListener('change', () => { t.showExited = exited.checked; markTree(true); });
    const find = h('input', { id: 'find-input', type: 'text', placeholder: 'name or path', autocomplete: 'off' });
    const findErr = h('span', { id: 'find-error', class: 'error', role: 'alert' });
    const findForm = h('form', { id: 'find-form', class: 'inline-form' },
      h('label', { for: 'find-input' }, 'Open process'), find, h('button', { type: 'submit' }, 'Open'), findErr);
    findForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      findErr.textContent = '';
      const target = find.value.trim();
      if (!target) return;
      try {
        const info = await api('FindProcess', { target });
        location.hash = '#/proc/' + info.pid;
      } catch (err) { findErr.textContent = err.message; }
    });
    const box = h('div', { id: 'tree', class: 'tree', role: 'tree', tabindex: '0', 'aria-label': 'Process tree', 'aria-describedby': 'tree-help' },
      h('div', { class: 'tree-spacer' },
        h('div', { class: 'tree-head tree-grid', 'aria-hidden': 'true' },
          ['PID', 'Name', 'Role', 'State', 'Model', 'Mailbox', 'Tokens'].map((s) => h('span', null, s))),
        h('div', { class: 'tree-rows' })));
    box.addEventListener('scroll', () => { t.scrollTop = box.scrollTop; markTree(false); }, { passive: true });
    box.addEventListener('keydown', treeKey);
    box.addEventListener('click', (e) => {
      const tog = e.target.closest('[data-toggle]');
      const row = e.target.closest('.tree-row');
      if (tog) { toggleNode(Number(tog.getAttribute('data-toggle'))); box.focus({ preventScroll: true }); }
      if (row) { selectRow(Number(row.getAttribute('data-pid')), false); if (!e.target.closest('a')) box.focus({ preventScroll: true }); }
    });
    const onResize = () => markTree(false);
    window.addEventListener('resize', onResize);
    ctx.cleanups.push(() => window.removeEventListener('resize', onResize));
    put(ctx.root,
      viewHead('Processes', h('span', { id: 'tree-count', class: 'muted' })),
      h('div', { class: 'toolbar' },
        h('label', { for: 'tree-filter' }, 'Filter'), filter,
        h('label', { class: 'check' }, exited, ' Show exited'), findForm),
      h('p', { id: 'tree-help', class: 'muted small' }, 'Arrow keys move and fold, Enter opens the selected process.'),
      h('p', { id: 'tree-status', class: 'muted', role: 'status' }),
      box);
    box.scrollTop = t.scrollTop;
    markTree(true);
  }

  // ---- event summaries

  const EVENT_TYPES = ['spawned', 'exited', 'reaped', 'restarted', 'task_finished', 'llm_call', 'tool_call',
    'cron_run', 'denied', 'route_denied', 'escalated', 'message_expired', 'message_dropped', 'kernel_message',
    'mcp_server', 'approval_requested', 'approval_resolved', 'notify_failed', 'token', 'skill_changed', 'lagged', 'pruned'];

  function summarize(ev) {
    const d = ev.d || {};
    const err = d.error ? ' — error: ' + d.error : '';
    switch (ev.type) {
      case 'spawned': return `${d.name || ''} (${d.role || '?'}, ${d.runtime || '?'}) under ${d.ppid}${d.restored ? ', restored' : ''}`;
      case 'exited': return `${d.name || ''} exit code ${d.exit_code}${d.reason ? ': ' + d.reason : ''}`;
      case 'reaped': return 'by ' + String(d.by || '').replace(/_/g, ' ');
      case 'restarted': return `attempt ${d.attempt}${d.manual ? ', manual' : ', after ' + fmtDur(d.delay_ms)}`;
      case 'task_finished': return `request ${d.request_id} from ${d.from}: ${d.success ? 'ok' : 'failed'} in ${fmtDur(d.duration_ms)}${err}`;
      case 'llm_call': return `${d.model}: ${fmtInt(d.prompt_tokens)} + ${fmtInt(d.completion_tokens)} tokens, ${fmtUsd(num(d.cost_nano_usd) / 1e9)}, ${fmtDur(d.duration_ms)}${err}`;
      case 'tool_call': return `${d.tool}: ${d.ok ? 'ok' : 'failed'} in ${fmtDur(d.duration_ms)}${err}`;
      case 'cron_run': return `${d.name}: ${d.status} in ${fmtDur(d.duration_ms)}`;
      case 'skill_changed': return `skill ${d.name} ${d.action} (version ${d.version}, ${d.visibility}, owner ${d.owner}) by ${d.by}${d.reason ? ': ' + d.reason : ''}`;
      case 'denied': return `${d.action}: ${d.reason}`;
      case 'route_denied': return `to ${d.to}: ${d.reason}`;
      case 'escalated': return `child ${d.child} ${d.name || ''}: ${d.restarts} restarts within ${d.within_seconds} s`;
      case 'mcp_server': return `${d.server}: ${d.state}${d.reason ? ' — ' + d.reason : ''}`;
      case 'approval_requested': return `#${d.id} ${d.kind}${d.tool ? ' ' + d.tool : ''}: ${d.text || ''}`;
      case 'approval_resolved': return `#${d.id} ${d.decision} by ${d.by}${d.text ? ': ' + d.text : ''}`;
      case 'lagged': case 'pruned': return `${fmtInt(d.missed)} events missed`;
      default: {
        const parts = [];
        for (const [k, v] of Object.entries(d)) if (k !== 'type') parts.push(`${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`);
        return parts.join(', ');
      }
    }
  }

  function subtreeOf(pid) {
    const set = new Set([pid]);
    const stack = [pid];
    while (stack.length) {
      const n = state.procs.get(stack.pop());
      if (n) for (const k of n.kids) { set.add(k); stack.push(k); }
    }
    return set;
  }

  // ---- events view

  // The newest events the kernel kept from before this page opened, put in front of
  // those the live stream brought (once per page; not applied to the tree, which was
  // listed whole).
  function loadEventHistory(onLoaded) {
    if (state.events.history) return;
    const events = state.events, got = [];
    const failed = () => { if (events.history === w) events.history = null; };
    const w = watch('SubscribeEvents', { replay: true, tail: EVENTS_KEPT }, (ev) => {
      if (ev.type !== 'replay_done') { if (num(ev.seq)) got.push(ev); return; }
      w.close();
      if (state.events !== events) return;   // logged out meanwhile
      const list = events.list;
      let first = Infinity;
      for (const e of list) if (num(e.seq)) { first = num(e.seq); break; }
      const older = got.filter((e) => num(e.seq) < first);
      for (const e of older) e.d = parseJson(e.detail);
      const room = EVENTS_KEPT - list.length;
      if (room > 0) list.unshift(...older.slice(-room));
      // Live events up to here came with the history: the live stream's copies are dropped.
      events.historySeq = got.length ? num(got[got.length - 1].seq) : 0;
      onLoaded();
    }, { onError: failed, onDrop: failed });
    events.history = w;
  }

  function viewEvents(ctx) {
    const f = { type: '', who: '', subtree: '', trace: '' };
    let paused = false, missed = 0, frame = 0;
    const typeSel = h('select', { id: 'events-type' }, h('option', { value: '' }, 'All types'),
      EVENT_TYPES.map((t) => h('option', { value: t }, t)));
    const who = h('input', { id: 'events-pid', type: 'text', placeholder: 'PID or name', autocomplete: 'off' });
    const sub = h('input', { id: 'events-subtree', type: 'text', inputmode: 'numeric', placeholder: 'PID', autocomplete: 'off' });
    const trace = h('input', { id: 'events-trace', type: 'text', placeholder: 'trace id', autocomplete: 'off', class: 'mono' });
    const pause = h('button', { id: 'events-pause', type: 'button', 'aria-pressed': 'false' }, 'Pause');
    const count = h('p', { id: 'events-count', class: 'muted' });
    const tbody = h('tbody');
    const rowCache = new WeakMap();   // event -> its row, built once
    // A busy kernel sends many events a second: the table is redrawn at most 4 times a second.
    const schedule = throttle(() => { if (!frame) frame = requestAnimationFrame(render); }, 250);
    ctx.cleanups.push(() => { schedule.cancel(); cancelAnimationFrame(frame); });
    for (const [el, key] of [[typeSel, 'type'], [who, 'who'], [sub, 'subtree'], [trace, 'trace']]) {
      el.addEventListener('input', () => { f[key] = el.value.trim(); schedule(); });
    }
    pause.addEventListener('click', () => {
      paused = !paused;
      pause.setAttribute('aria-pressed', String(paused));
      pause.textContent = paused ? 'Resume' : 'Pause';
      missed = 0;
      schedule();
    });

    function accept() {
      const whoQ = f.who.toLowerCase();
      const whoPid = /^\d+$/.test(whoQ) ? Number(whoQ) : 0;
      const subSet = /^\d+$/.test(f.subtree) ? subtreeOf(Number(f.subtree)) : null;
      const traceQ = f.trace.toLowerCase();
      return (ev) => {
        if (f.type && ev.type !== f.type) return false;
        if (traceQ && !String(ev.traceId || '').toLowerCase().startsWith(traceQ)) return false;
        if (subSet && !subSet.has(num(ev.pid))) return false;
        if (whoQ) {
          if (whoPid) return num(ev.pid) === whoPid;
          const n = state.procs.get(num(ev.pid));
          const name = String((n && n.info.name) || (ev.d && ev.d.name) || '').toLowerCase();
          if (!name.includes(whoQ)) return false;
        }
        return true;
      };
    }

    function render() {
      frame = 0;
      if (paused) {
        count.textContent = `Paused${missed ? `: ${missed.toLocaleString()} new events not shown` : ''}.`;
        return;
      }
      const ok = accept(), list = state.events.list, rows = [];
      let matched = 0;
      for (let i = list.length - 1; i >= 0 && i >= list.length - EVENTS_KEPT; i--) {
        const ev = list[i];
        if (!ok(ev)) continue;
        matched++;
        if (rows.length < EVENTS_SHOWN) {
          let row = rowCache.get(ev);
          if (!row) { row = eventRow(ev); rowCache.set(ev, row); }
          rows.push(row);
        }
      }
      // Rows already in place stay: only new ones are inserted and old ones dropped.
      const want = new Set(rows);
      for (const el of [...tbody.children]) if (!want.has(el)) el.remove();
      let at = tbody.firstChild;
      for (const row of rows) {
        if (row === at) at = at.nextSibling; else tbody.insertBefore(row, at);
      }
      count.textContent = `${matched.toLocaleString()} events` + (matched > EVENTS_SHOWN ? `, the newest ${EVENTS_SHOWN} shown` : '')
        + ` (the latest ${Math.min(list.length, EVENTS_KEPT).toLocaleString()} are kept).`;
    }

    ctx.onEvent = () => { if (paused) missed++; schedule(); };
    put(ctx.root,
      viewHead('Events'),
      h('div', { class: 'toolbar wrap' },
        h('label', null, 'Type ', typeSel),
        h('label', null, 'Process ', who),
        h('label', null, 'Subtree of ', sub),
        h('label', null, 'Trace ', trace),
        pause),
      count,
      h('div', { class: 'table-wrap' },
        h('table', { id: 'events-table', class: 'events' },
          h('caption', { class: 'sr-only' }, 'Kernel events, newest first'),
          h('thead', null, h('tr', null, ['Time', 'Seq', 'PID', 'Type', 'Detail', 'Trace'].map((s) => h('th', { scope: 'col' }, s)))),
          tbody)));
    render();
    loadEventHistory(() => { if (ctx.alive) schedule(); });
  }

  function eventRow(ev) {
    const marker = !num(ev.seq);
    return h('tr', { 'data-testid': 'event-row', 'data-seq': ev.seq, class: marker ? 'marker' : null },
      h('td', { class: 'nowrap' }, timeEl(ev.atUnixMs, { plain: true })),
      numCell(marker ? '—' : String(ev.seq)),
      h('td', { class: 'nowrap' }, pidLink(ev.pid, true), ev.node ? dim(' @' + ev.node) : null),
      h('td', null, h('span', { class: 'etype etype-' + String(ev.type).replace(/[^a-z_]/g, '') }, ev.type)),
      h('td', { class: 'detail' }, summarize(ev)),
      h('td', null, traceLink(ev.traceId)));
  }

  // ---- trace view

  function viewTrace(ctx, id) {
    const traceId = String(id || '').toLowerCase();
    const events = new Map();        // seq -> event of this trace
    let done = false, pruned = 0, frame = 0, changed = true, lastSeq = 0, failed = false;
    const status = h('p', { id: 'trace-status', class: 'muted', role: 'status' });
    const prunedNote = h('p', { id: 'trace-pruned', class: 'warning', hidden: true });
    const body = h('div', { id: 'trace-waterfall', class: 'waterfall' });
    const schedule = () => { if (!frame) frame = requestAnimationFrame(render); };
    ctx.cleanups.push(() => cancelAnimationFrame(frame));
    const take = (ev) => {
      if (!ev.d) ev.d = parseJson(ev.detail);
      if (String(ev.traceId || '').toLowerCase() === traceId && num(ev.seq)) { events.set(num(ev.seq), ev); changed = true; schedule(); }
    };
    for (const ev of state.events.list) take(ev);
    // The kernel replays the kept log filtered to this trace, then sends its new events
    // (after a lost connection, from where it stopped).
    const w = liveWatch('SubscribeEvents', () => ({ replay: true, sinceSeq: lastSeq, traceId }), (ev) => {
      if (ev.type === 'pruned') pruned += num(parseJson(ev.detail).missed);
      else if (ev.type === 'replay_done') { done = true; lastSeq = Math.max(lastSeq, num(parseJson(ev.detail).last_seq)); }
      else if (num(ev.seq)) { lastSeq = Math.max(lastSeq, num(ev.seq)); take(ev); }
      schedule();
    }, { onError: (err) => { failed = true; status.textContent = err.message; status.className = 'error'; } });
    ctx.cleanups.push(() => w.close());
    put(ctx.root,
      viewHead('Trace', h('code', { class: 'mono trace-id' }, traceId)),
      status, prunedNote, body);
    schedule();

    function render() {
      frame = 0;
      if (!failed) {
        status.textContent = (done ? 'Replay complete' : 'Reading the event log…')
          + ` — ${events.size.toLocaleString()} events in this trace` + (done ? ', new ones appear live.' : '.');
      }
      if (pruned) {
        prunedNote.hidden = false;
        prunedNote.textContent = `The kernel no longer keeps the oldest ${pruned.toLocaleString()} events: parts of this trace may be missing.`;
      }
      if (!changed && !(done && !events.size)) return;
      changed = false;
      const list = [...events.values()].sort((a, b) => num(a.seq) - num(b.seq));
      fill(body, list.length ? waterfall(list) : note(done ? 'No event carries this trace id.' : ''));
    }
  }

  function waterfall(list) {
    // Each event is stamped when it happened; one with a duration began that long before.
    let t0 = Infinity, t1 = -Infinity;
    for (const ev of list) {
      const end = num(ev.atUnixMs), start = end - num(ev.d.duration_ms);
      t0 = Math.min(t0, start); t1 = Math.max(t1, end);
    }
    const span = Math.max(1, t1 - t0);
    const byPid = new Map(), ppidOf = new Map();
    for (const ev of list) {
      const pid = num(ev.pid);
      if (!byPid.has(pid)) byPid.set(pid, []);
      byPid.get(pid).push(ev);
      if ((ev.type === 'spawned' || ev.type === 'exited') && ev.d.ppid) ppidOf.set(pid, num(ev.d.ppid));
    }
    const parentOf = (pid) => {
      const n = state.procs.get(pid);
      return n ? n.parent : ppidOf.get(pid) || 0;
    };
    // Each process hangs under its nearest ancestor that is in the trace too.
    const kids = new Map(), tops = [];
    for (const pid of byPid.keys()) {
      let p = parentOf(pid), guard = 0;
      while (p && !byPid.has(p) && guard++ < 1000) p = parentOf(p);
      if (p && p !== pid && byPid.has(p)) { if (!kids.has(p)) kids.set(p, []); kids.get(p).push(pid); } else tops.push(pid);
    }
    const out = [h('div', { class: 'wf-axis', 'aria-hidden': 'true' }, h('span', null, '0'), h('span', null, fmtDur(span)))];
    const seen = new Set();
    const walk = (pid, depth) => {
      if (seen.has(pid)) return;
      seen.add(pid);
      const n = state.procs.get(pid);
      const name = n ? n.info.name : (byPid.get(pid).find((e) => e.d.name) || { d: {} }).d.name;
      const head = h('h3', { class: 'wf-proc' }, pidLink(pid), name ? ' ' + name : '');
      head.style.paddingLeft = depth * 16 + 'px';
      out.push(head);
      for (const ev of byPid.get(pid)) out.push(waterfallRow(ev, t0, span, depth));
      for (const k of kids.get(pid) || []) walk(k, depth + 1);
    };
    for (const pid of tops) walk(pid, 0);
    return h('div', { role: 'list', 'aria-label': 'Trace events by process' }, out);
  }

  function waterfallRow(ev, t0, span, depth) {
    const end = num(ev.atUnixMs), dur = num(ev.d.duration_ms), start = end - dur;
    const bar = h('span', { class: 'wf-bar' + (dur ? '' : ' wf-point') + (ev.d.error || ev.d.ok === false || ev.d.success === false ? ' wf-fail' : '') });
    bar.style.left = ((start - t0) / span) * 100 + '%';
    bar.style.width = dur ? Math.max(0.4, (dur / span) * 100) + '%' : '';
    const label = h('div', { class: 'wf-label' },
      h('span', { class: 'mono muted' }, '+' + fmtDur(start - t0)), ' ',
      h('strong', null, ev.type), ' ', summarize(ev));
    label.style.paddingLeft = depth * 16 + 'px';
    return h('div', { class: 'wf-row', role: 'listitem', 'data-testid': 'trace-row', 'data-seq': ev.seq },
      label, h('div', { class: 'wf-track', 'aria-hidden': 'true' }, bar));
  }

  // ---- process page

  async function viewProc(ctx, arg) {
    let pid = /^\d+$/.test(arg) ? Number(arg) : 0;
    const title = h('h1', { tabindex: '-1' }, 'Process ' + (pid || arg));
    put(ctx.root, h('div', { class: 'view-head' }, title, h('span', { id: 'proc-state-head' })));
    if (!pid) {
      try {
        const info = await api('FindProcess', { target: arg });
        if (ctx.alive) location.replace('#/proc/' + info.pid);
      } catch (err) { if (ctx.alive) put(ctx.root, errorLine(err.message, 'proc-error')); }
      return;
    }
    const details = h('div', { id: 'proc-details', class: 'grid' }, note('Loading…'));
    const children = section('Children', 'proc-children', note('Loading…'));
    const cron = section('Cron entries aimed at it', 'proc-cron', note('Loading…'));
    const actions = canAct() ? procActions(ctx, pid) : null;
    const transcript = transcriptPanel(ctx, pid);
    put(ctx.root, actions || '', details, h('div', { class: 'grid' }, children, cron), transcript);

    let info;
    try { info = await api('GetProcess', { pid }); } catch (err) {
      if (ctx.alive) fill(details, errorLine(err.message, 'proc-error'));
      return;
    }
    if (!ctx.alive) return;
    const show = (i) => {
      info = i;
      title.textContent = `Process ${i.pid}${i.name ? ' — ' + i.name : ''}`;
      $('proc-state-head').replaceChildren(stateBadge(i.state));
      fill(details, ...procSections(i));
      document.title = `${i.name || 'Process ' + i.pid} · HiveKernel`;
    };
    show(info);
    if (state.procs.has(pid)) upsert(info);
    const log = info.runtime === 'exec' ? logPanel(ctx, pid) : null;
    if (log) ctx.root.insertBefore(log.el, transcript);
    ctx.onProc = (i) => { if (num(i.pid) === pid) { show(i); if (log) log.more(); } };

    const loadChildren = throttle(async () => {
      try {
        const batches = await api('ListProcesses', { root: pid, maxDepth: 1 });
        if (!ctx.alive) return;
        const list = [];
        for (const b of batches || []) for (const p of (b && b.processes) || []) if (num(p.pid) !== pid) list.push(p);
        fill(children, children.firstChild, list.length
          ? table(['PID', 'Name', 'Role', 'State', 'Mailbox', 'Tokens'], list.map((p) => h('tr', null,
            h('td', null, pidLink(p.pid)), h('td', null, p.name), h('td', null, roleText(p.role)),
            h('td', null, stateBadge(p.state)), numCell(fmtInt(p.mailboxLen)),
            numCell(fmtInt(tokensOf(p.usage))))))
          : note('No children.'));
      } catch (err) { if (ctx.alive) fill(children, children.firstChild, errorLine(err.message)); }
    }, 1000);
    ctx.cleanups.push(() => loadChildren.cancel());
    loadChildren();
    ctx.onEvent = (ev) => {
      const evPid = num(ev.pid), n = state.procs.get(evPid);
      if ((ev.type === 'spawned' || ev.type === 'exited' || ev.type === 'reaped' || ev.type === 'restarted')
        && (num(ev.d.ppid) === pid || (n && n.parent === pid) || (ev.type === 'restarted' && evPid === pid))) loadChildren();
    };

    try {
      const r = await api('ListCron', {});
      if (!ctx.alive) return;
      const mine = ((r && r.entries) || []).filter((e) => num(e.spec && e.spec.target ? e.spec.target : e.owner) === pid);
      fill(cron, cron.firstChild, mine.length
        ? table(['Name', 'Schedule', 'Action', 'Next run', 'Last run'], mine.map((e) => h('tr', null,
          h('td', null, e.spec.name), h('td', null, h('code', null, e.spec.expression)), h('td', null, e.spec.action || 'execute'),
          h('td', null, timeEl(e.nextRunUnixMs, { none: 'none' })), h('td', null, timeEl(e.lastRunUnixMs, { none: 'never' })))))
        : note('None.'));
    } catch (err) { if (ctx.alive) fill(cron, cron.firstChild, errorLine(err.message)); }
  }

  // An exec agent's log file, read through the kernel: its tail, then what
  // was added since, whenever the process is refreshed or on request.
  function logPanel(ctx, pid) {
    const pre = h('pre', { id: 'exec-log', class: 'text log', tabindex: '0', 'aria-label': 'Log file' });
    const status = h('p', { id: 'exec-log-status', class: 'muted', role: 'status' });
    const refresh = h('button', { id: 'exec-log-refresh', type: 'button', class: 'small' }, 'Read new lines');
    let offset = null, busy = false;
    async function more() {
      if (busy || !ctx.alive) return;
      busy = true;
      try {
        const req = offset == null ? { pid, tail: true, maxBytes: 65536 } : { pid, offset, maxBytes: 1048576 };
        const chunk = await api('ReadLog', req);
        if (!ctx.alive) return;
        if (offset != null && num(chunk.offset) < offset) pre.textContent = '';
        if (offset == null && num(chunk.offset) > 0) status.textContent = `The last ${fmtInt(num(chunk.size) - num(chunk.offset))} bytes of ${fmtInt(chunk.size)}.`;
        pre.append(chunk.text || '');
        offset = num(chunk.size);
        if (!pre.textContent) status.textContent = 'Nothing logged yet.';
        else if (pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40) pre.scrollTop = pre.scrollHeight;
      } catch (err) { if (ctx.alive) status.textContent = err.message; } finally { busy = false; }
    }
    refresh.addEventListener('click', more);
    more();
    return { el: section('Log', 'proc-log', h('div', { class: 'toolbar' }, refresh), status, pre), more };
  }

  function usageKv(u) {
    if (!u) return note('None recorded.');
    return kv([['Model calls', fmtInt(u.calls)], ['Prompt tokens', fmtInt(u.promptTokens)],
      ['Completion tokens', fmtInt(u.completionTokens)], ['Tokens in all', fmtInt(tokensOf(u))], ['Cost', fmtUsd(u.costUsd)]]);
  }
  function exitKv(x) {
    if (!x) return null;
    return kv([['Exit code', String(num(x.exitCode))], ['Reason', x.reason || ''], ['Exited', timeEl(x.exitedAtUnixMs)],
      ['Output', x.output ? h('pre', { class: 'text' }, x.output) : '']]);
  }
  const limitText = (v, unit) => (num(v) ? fmtInt(v) + (unit || '') : dim('none (0)'));
  function chips(list, empty) {
    if (!list || !list.length) return note(empty);
    return h('ul', { class: 'chips' }, list.map((s) => h('li', null, s)));
  }

  function procSections(i) {
    const lim = i.limits || {}, rs = i.restart || {}, b = i.budget;
    const out = [];
    out.push(section('Identity', 'proc-identity', kv([
      ['PID', String(i.pid)], ['Parent', num(i.ppid) ? pidLink(i.ppid, true) : 'none'], ['Name', i.name],
      ['Role', roleText(i.role)], ['Tier', tierText(i.tier)], ['State', stateBadge(i.state, 'proc-state')],
      ['Node', i.node ? h('a', { href: '#/nodes' }, i.node) : undefined],
      ['Model', i.model], ['Runtime', i.runtime], ['Started', timeEl(i.startedAtUnixMs)],
      ['Restored after a kernel restart', i.restored ? 'yes' : 'no'], ['Depth', String(num(i.depth))],
      ['Children', fmtInt(i.children)], ['Mailbox depth', fmtInt(i.mailboxLen)],
      ['Log file', i.logPath ? h('code', null, i.logPath) : undefined],
    ])));
    out.push(section('Limits', 'proc-limits', kv([
      ['Max children', limitText(lim.maxChildren)], ['Max depth', limitText(lim.maxDepth)],
      ['Task timeout', limitText(lim.timeoutSeconds, ' s')], ['Concurrent tasks', limitText(lim.maxConcurrentTasks)],
      ['Own token budget', limitText(lim.maxTokensTotal)], ['Spawns per minute', limitText(lim.spawnsPerMinute)],
      ['Model calls per minute', limitText(lim.llmCallsPerMinute)],
    ])));
    out.push(section('Capabilities and tools', 'proc-caps',
      h('h3', null, 'Capabilities'), chips(i.capabilities, 'None.'),
      h('h3', null, 'Tools'), chips(i.tools, 'None.')));
    const backoff = rs.backoffMs && rs.backoffMs.length ? rs.backoffMs.map(fmtDur).join(' to ') : '100 ms to 30 s (default)';
    out.push(section('Supervision', 'proc-restart', kv([
      ['Restart policy', enumText(rs.policy, 'RESTART_POLICY_')],
      ['Intensity', `${rs.maxRestarts == null ? '3 (default)' : rs.maxRestarts} restarts within ${rs.withinSeconds == null ? '5 (default)' : rs.withinSeconds} s`],
      ['Backoff', backoff], ['Restarts so far', fmtInt(i.restarts)],
      ['Children strategy', enumText(i.strategy, 'STRATEGY_')],
    ]), i.exit ? [h('h3', null, 'Exit'), exitKv(i.exit)] : null,
    i.lastExit ? [h('h3', null, 'Exit before the latest restart'), exitKv(i.lastExit)] : null));
    out.push(section('Usage', 'proc-usage',
      h('h3', null, 'Its own'), usageKv(i.usage),
      h('h3', null, 'With its subtree'), usageKv(i.subtreeUsage),
      h('h3', null, 'Token budget'),
      b ? kv([['Allocated to', pidLink(b.owner, true)], ['Total', fmtInt(b.maxTokensTotal)], ['Used', fmtInt(b.used)], ['Remaining', fmtInt(b.remaining)]])
        : h('p', null, 'Unlimited.')));
    const meta = Object.entries(i.metadata || {});
    out.push(section('Metadata', 'proc-metadata', meta.length
      ? table(['Key', 'Value'], meta.sort().map(([k, v]) => h('tr', null, h('td', null, k), h('td', null, v))))
      : note('None.')));
    return out;
  }

  function procActions(ctx, pid) {
    const err = h('p', { id: 'action-error', class: 'error', role: 'alert' });
    const result = h('p', { id: 'action-result', role: 'status' });
    const fail = (e) => { if (ctx.alive) err.textContent = e.message; };

    const execInput = h('textarea', { id: 'exec-input', class: 'action', rows: 3, required: true, placeholder: 'Describe the task' });
    const execSubmit = h('button', { id: 'exec-submit', type: 'submit', class: 'action primary' }, 'Run task');
    const execStatus = h('span', { id: 'exec-status', class: 'muted', 'aria-live': 'polite' });
    const execResult = h('div', { id: 'exec-result', 'aria-live': 'polite' });
    const execForm = h('form', { id: 'exec-form', class: 'action stack' },
      h('label', { for: 'exec-input' }, 'Execute a task (waits for its answer)'), execInput,
      h('div', { class: 'row-line' }, execSubmit, execStatus), execResult);
    execForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      const description = execInput.value.trim();
      if (!description) { execInput.focus(); return; }
      err.textContent = '';
      execResult.replaceChildren();
      execSubmit.disabled = true;
      const started = Date.now();
      fill(execStatus, h('span', { class: 'spinner', 'aria-hidden': 'true' }), ' Running…');
      const tick = setInterval(() => { execStatus.lastChild.textContent = ` Running… ${Math.round((Date.now() - started) / 1000)} s`; }, 1000);
      ctx.cleanups.push(() => clearInterval(tick));
      try {
        const r = await api('ExecuteTask', { pid, description });
        if (!ctx.alive) return;
        fill(execResult, r.success
          ? h('div', { class: 'result ok' }, h('strong', null, 'Succeeded'), ` in ${fmtDur(Date.now() - started)}`, ' · trace ', traceLink(r.traceId), h('pre', { class: 'text' }, r.output || ''))
          : h('div', { class: 'result failed', role: 'alert' }, h('strong', null, 'Failed'), ' · trace ', traceLink(r.traceId), h('pre', { class: 'text' }, r.error || '(no reason given)')));
      } catch (e2) {
        if (!ctx.alive) return;
        fail(e2);
        fill(execResult, h('div', { class: 'result failed' }, h('strong', null, 'Failed: '), e2.message));
      } finally {
        clearInterval(tick);
        if (ctx.alive) { execSubmit.disabled = false; execStatus.textContent = ''; }
      }
    });

    const sendInput = h('textarea', { id: 'send-input', class: 'action', rows: 2, required: true, placeholder: 'Message payload' });
    const sendSubmit = h('button', { id: 'send-submit', type: 'submit', class: 'action' }, 'Send');
    const sendResult = h('p', { id: 'send-result', 'aria-live': 'polite' });
    const sendForm = h('form', { id: 'send-form', class: 'action stack' },
      h('label', { for: 'send-input' }, 'Send a message to its mailbox'), sendInput, h('div', { class: 'row-line' }, sendSubmit), sendResult);
    sendForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      err.textContent = '';
      sendResult.replaceChildren();
      sendSubmit.disabled = true;
      try {
        const r = await api('SendMessage', { to: pid, payload: sendInput.value });
        if (!ctx.alive) return;
        sendInput.value = '';
        fill(sendResult, `Sent as message ${r.messageId} · trace `, traceLink(r.traceId));
      } catch (e2) { fail(e2); } finally { if (ctx.alive) sendSubmit.disabled = false; }
    });

    const restart = h('button', { id: 'action-restart', type: 'button', class: 'action' }, 'Restart');
    restart.addEventListener('click', async () => {
      err.textContent = '';
      result.textContent = '';
      restart.disabled = true;
      try {
        const r = await api('RestartProcess', { pid, reason: 'restart requested from the dashboard' });
        if (ctx.alive) result.textContent = `Restarted (attempt ${r.attempt}).`;
      } catch (e2) { fail(e2); } finally { if (ctx.alive) restart.disabled = false; }
    });
    const kill = h('button', { id: 'action-kill', type: 'button', class: 'action danger' }, 'Kill');
    kill.addEventListener('click', async () => {
      err.textContent = '';
      const n = state.procs.get(pid);
      if (!window.confirm(`Kill process ${pid}${n && n.info.name ? ' (' + n.info.name + ')' : ''} and its whole subtree?`)) return;
      kill.disabled = true;
      try {
        const r = await api('Kill', { pid, reason: 'killed from the dashboard' });
        const killed = (r && r.killed) || [];
        flash(killed.length ? `Killed ${killed.length === 1 ? 'process' : 'processes'} ${killed.join(', ')}.` : `Process ${pid} had already exited.`);
        location.hash = '#/tree';
      } catch (e2) { fail(e2); if (ctx.alive) kill.disabled = false; }
    });
    return h('section', { class: 'card actions', id: 'proc-actions', 'aria-labelledby': 'proc-actions-h' },
      h('h2', { id: 'proc-actions-h' }, 'Actions'),
      h('div', { class: 'grid' }, execForm, sendForm),
      h('div', { class: 'row-line' }, restart, kill), err, result);
  }

  // ---- transcript

  const ENTRY_LABEL = {
    input: 'Input', message: 'Message', request: 'Model request', response: 'Model answer',
    model_error: 'Model error', tool_result: 'Tool result', answer: 'Final answer', failed: 'Turn failed',
    partial: 'Model answer, streaming',
  };

  function transcriptPanel(ctx, pid) {
    let lastId = 0, tail = 50, watcher = null;
    // The answer streaming in, shown until the entry after it (the whole answer) arrives.
    let streaming = null;
    const log = h('div', { id: 'transcript', class: 'transcript', role: 'log', 'aria-label': 'Transcript', tabindex: '0' });
    const status = h('p', { id: 'transcript-status', class: 'muted', role: 'status' });
    const all = h('button', { type: 'button', id: 'transcript-all', class: 'quiet' }, 'Show every turn');
    const scope = h('span', { id: 'transcript-scope', class: 'muted small' }, 'the latest 50 turns, live');
    all.addEventListener('click', () => { tail = 0; all.hidden = true; scope.textContent = 'every turn kept, live'; load(); });
    ctx.cleanups.push(() => { if (watcher) watcher.close(); });

    function append(entries) {
      const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
      const frag = document.createDocumentFragment();
      for (const e of entries) {
        if (num(e.id) <= lastId) continue;
        lastId = num(e.id);
        if (e.type === 'partial') {
          if (!streaming) {
            streaming = h('article', { class: 'entry entry-partial', 'data-testid': 'transcript-streaming' },
              h('header', null, h('strong', null, ENTRY_LABEL.partial), ` · turn ${e.turn}`),
              h('pre', { class: 'text' }));
            put(frag, streaming);
          }
          const d = parseJson(e.detail);
          const piece = h('span', d.reasoning ? { class: 'muted' } : null, String(d.text || ''));
          put(streaming.lastChild, piece);
          continue;
        }
        if (streaming) { streaming.remove(); streaming = null; }
        put(frag, transcriptEntry(e));
      }
      put(log, frag);
      if (atBottom) log.scrollTop = log.scrollHeight;
    }

    async function load() {
      if (watcher) { watcher.close(); watcher = null; }
      log.replaceChildren();
      lastId = 0;
      streaming = null;
      status.textContent = 'Loading the transcript…';
      status.className = 'muted';
      let pageToken = '';
      try {
        do {
          const r = await api('GetTranscript', { pid, tailTurns: tail, pageSize: 500, pageToken });
          if (!ctx.alive) return;
          append((r && r.entries) || []);
          pageToken = (r && r.nextPageToken) || '';
        } while (pageToken);
      } catch (err) {
        if (!ctx.alive) return;
        status.textContent = err.message;
        status.className = 'error';
        return;
      }
      status.textContent = log.childElementCount ? '' : 'Nothing recorded yet.';
      log.scrollTop = log.scrollHeight;
      watcher = liveWatch('WatchTranscript', () => (lastId ? { pid, afterId: lastId } : { pid, tailTurns: tail }), (e) => {
        append([e]);
        if (status.textContent === 'Nothing recorded yet.') status.textContent = '';
      }, {
        onEnd: () => { if (ctx.alive) status.textContent = 'The process has exited: its transcript is complete.'; },
        onError: (err) => { if (ctx.alive) { status.textContent = err.message; status.className = 'error'; } },
      });
    }
    load();
    return h('section', { class: 'card', id: 'proc-transcript', 'aria-labelledby': 'proc-transcript-h' },
      h('div', { class: 'view-head' }, h('h2', { id: 'proc-transcript-h' }, 'Transcript'), scope, all),
      log, status);
  }

  function toolCalls(calls) {
    if (!Array.isArray(calls) || !calls.length) return null;
    return h('ul', { class: 'calls' }, calls.map((c) => h('li', { class: 'call' },
      h('div', null, 'Calls ', h('code', null, String(c.name || '?')), c.id ? dim(` (${c.id})`) : ''),
      h('pre', { class: 'json' }, pretty(c.arguments == null ? '' : c.arguments)))));
  }
  const pre = (t, cls) => (t ? h('pre', { class: 'text' + (cls ? ' ' + cls : '') }, String(t)) : null);
  const meta = (...parts) => h('p', { class: 'meta muted' }, parts.filter(Boolean).join(' · '));

  function transcriptEntry(e) {
    const d = parseJson(e.detail), type = e.type;
    const el = h('article', { class: 'entry entry-' + String(type).replace(/[^a-z_]/g, ''), 'data-testid': 'transcript-entry', 'data-id': e.id, 'data-type': type });
    put(el, h('header', null, h('strong', null, ENTRY_LABEL[type] || type), ` · turn ${e.turn} · `,
      timeEl(e.atUnixMs, { plain: true }), e.traceId ? [' · trace ', traceLink(e.traceId)] : null));
    switch (type) {
      case 'input': {
        const s = d.source || {};
        put(el, meta(s.kind === 'task' ? `task ${s.request_id} from PID ${s.from}`
          : s.kind === 'message' ? `message ${s.message_id} (${s.type || 'message'}) from PID ${s.from}` : s.kind), pre(d.text));
        break;
      }
      case 'message':
        put(el, meta('role ' + (d.role || '?'), d.tool_call_id ? 'answers call ' + d.tool_call_id : ''), pre(d.content), toolCalls(d.tool_calls));
        break;
      case 'request':
        put(el, meta('model ' + (d.model || '?'), `${(d.messages || []).length} messages sent`,
          d.estimated_tokens ? `about ${fmtInt(d.estimated_tokens)} tokens` : '', d.max_tokens ? `at most ${fmtInt(d.max_tokens)} tokens` : ''));
        break;
      case 'response':
        put(el, pre(d.content), toolCalls(d.tool_calls), meta(d.finish_reason ? 'finished: ' + d.finish_reason : '',
          `${fmtInt(d.prompt_tokens)} prompt + ${fmtInt(d.completion_tokens)} completion tokens`, fmtDur(d.duration_ms)));
        break;
      case 'model_error':
        put(el, h('p', { class: 'error' }, 'Error: ', String(d.error || '')),
          d.partial ? [meta('what had come of the answer'), pre(d.partial)] : null, meta(fmtDur(d.duration_ms)));
        break;
      case 'tool_result':
        put(el, h('p', null, h('code', null, String(d.tool || '?')), ' — ',
          h('span', { class: d.ok ? 'ok-text' : 'error' }, d.ok ? 'ok' : 'failed'), ' · ', fmtDur(d.duration_ms),
          d.call_id ? dim(` · call ${d.call_id}`) : ''), pre(d.output));
        break;
      case 'answer':
        put(el, pre(d.text, 'answer'));
        break;
      case 'failed':
        put(el, h('p', { class: 'error' }, 'Failed: ', String(d.error || '')));
        break;
      default:
        put(el, h('pre', { class: 'json' }, pretty(e.detail)));
    }
    return el;
  }

  // ---- cron view

  function viewCron(ctx) {
    const err = h('p', { id: 'cron-error', class: 'error', role: 'alert' });
    const holder = h('div', { id: 'cron-list' }, note('Loading…'));
    const act = canAct();
    async function load() {
      try {
        const r = await api('ListCron', {});
        if (!ctx.alive) return;
        const entries = (r && r.entries) || [];
        fill(holder, entries.length ? cronTable(entries, act, change) : note('No cron entries.'));
      } catch (e) { if (ctx.alive) fill(holder, errorLine(e.message)); }
    }
    // One entry's action: RemoveCron, SetCronEnabled or RunCron.
    async function change(method, req, btn, ask) {
      if (ask && !window.confirm(ask)) return;
      err.textContent = '';
      btn.disabled = true;
      try {
        await api(method, req);
        if (!ctx.alive) return;
        if (method === 'RunCron') flash(`Cron entry "${req.name}" started.`);
        load();
      } catch (e) { if (ctx.alive) { err.textContent = e.message; btn.disabled = false; } }
    }
    const reload = throttle(load, 1000);
    ctx.cleanups.push(() => reload.cancel());
    ctx.onEvent = (ev) => { if (ev.type === 'cron_run') reload(); };
    put(ctx.root, viewHead('Cron'),
      act ? cronForm(ctx, err, load) : '', err, holder);
    load();
  }

  function cronTable(entries, act, change) {
    const head = ['Name', 'Schedule', 'Action', 'Target', 'Task', 'Next run', 'Last run', 'Runs', 'Latest result', 'Status', 'Source', 'Owner', 'Overlap / missed', 'Created'];
    if (act) head.push('Actions');
    const button = (label, action, name, cls, onClick) => {
      const b = h('button', { type: 'button', class: 'action small' + (cls ? ' ' + cls : ''), 'data-action': action, 'aria-label': `${label} ${name}` }, label);
      b.addEventListener('click', () => onClick(b));
      return b;
    };
    return table(head, entries.map((e) => {
      const s = e.spec || {}, hist = e.history || [], lastRun = hist[hist.length - 1];
      const buttons = act ? [
        button('Run now', 'run-cron', s.name, 'primary', (b) => change('RunCron', { name: s.name }, b)),
        s.disabled
          ? button('Enable', 'enable-cron', s.name, '', (b) => change('SetCronEnabled', { name: s.name, enabled: true }, b))
          : button('Disable', 'disable-cron', s.name, '', (b) => change('SetCronEnabled', { name: s.name, enabled: false }, b)),
        e.source !== 'config'
          ? button('Remove', 'remove-cron', s.name, 'danger', (b) => change('RemoveCron', { name: s.name }, b, `Remove the cron entry "${s.name}"?`))
          : h('span', { class: 'muted small', title: 'Entries declared in the config are removed there' }, 'declared in the config'),
      ] : null;
      const cells = [
        h('td', null, s.name), h('td', { class: 'nowrap' }, h('code', null, s.expression)), h('td', null, s.action || 'execute'),
        h('td', null, num(s.target) ? pidLink(s.target, true) : ['owner ', pidLink(e.owner)]),
        h('td', { class: 'detail' }, s.template ? `template ${s.template}: ` : '', s.description || ''),
        h('td', null, timeEl(e.nextRunUnixMs, { none: 'none' })), h('td', null, timeEl(e.lastRunUnixMs, { none: 'never' })),
        numCell(fmtInt(e.runs)),
        h('td', null, lastRun ? cronHistory(hist) : dim('—')),
        h('td', null, s.disabled ? 'disabled' : e.running ? 'running' : 'enabled', e.switched ? dim(' (by hand; the config says otherwise)') : '', s.disabled && e.running ? ', running' : ''),
        h('td', null, e.source || ''), h('td', null, pidLink(e.owner)),
        h('td', null, `${s.overlap || 'skip'} / ${s.missed || 'skip'}`), h('td', null, timeEl(e.createdUnixMs)),
      ];
      if (act) cells.push(h('td', { class: 'actions nowrap' }, buttons));
      return h('tr', { 'data-testid': 'cron-row', 'data-name': s.name }, cells);
    }), { id: 'cron-table' });
  }

  function cronHistory(hist) {
    const last = hist[hist.length - 1];
    return h('details', null, h('summary', null, `${last.status} (${fmtDur(last.duration_ms || last.durationMs)})`),
      h('ol', { class: 'history' }, hist.slice().reverse().map((r) => h('li', null,
        timeEl(r.atUnixMs, { plain: true }), ` ${r.status}, ${fmtDur(r.durationMs)}`, r.output ? pre(r.output) : null))));
  }

  function cronForm(ctx, err, reload) {
    const f = (id, label, input) => h('div', { class: 'field' }, h('label', { for: id }, label), input);
    const name = h('input', { id: 'cron-name', class: 'action', required: true, autocomplete: 'off' });
    const schedule = h('input', { id: 'cron-schedule', class: 'action mono', required: true, placeholder: '*/15 * * * * or @daily', autocomplete: 'off' });
    const action = h('select', { id: 'cron-action', class: 'action' }, ['execute', 'message', 'spawn'].map((a) => h('option', { value: a }, a)));
    const target = h('input', { id: 'cron-target', class: 'action', type: 'number', min: '0', step: '1', placeholder: '0: yourself' });
    const template = h('input', { id: 'cron-template', class: 'action', placeholder: 'spawn only', autocomplete: 'off' });
    const task = h('textarea', { id: 'cron-task', class: 'action', rows: 2, placeholder: 'The task or message text' });
    const submit = h('button', { id: 'cron-submit', type: 'submit', class: 'action primary' }, 'Add entry');
    const form = h('form', { id: 'cron-add-form', class: 'action card' },
      h('h2', null, 'Add a cron entry'),
      h('div', { class: 'fields' }, f('cron-name', 'Name', name), f('cron-schedule', 'Schedule', schedule),
        f('cron-action', 'Action', action), f('cron-target', 'Target PID', target), f('cron-template', 'Template', template)),
      f('cron-task', 'Task', task), submit);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      err.textContent = '';
      submit.disabled = true;
      try {
        await api('AddCron', { name: name.value.trim(), expression: schedule.value.trim(), action: action.value,
          target: Number(target.value) || 0, template: template.value.trim(), description: task.value });
        if (!ctx.alive) return;
        form.reset();
        reload();
      } catch (e2) { if (ctx.alive) err.textContent = e2.message; } finally { if (ctx.alive) submit.disabled = false; }
    });
    return form;
  }

  // ---- usage view

  function viewUsage(ctx) {
    const by = h('select', { id: 'usage-by' }, [['model', 'By model'], ['day', 'By day'], ['role', 'By role']].map(([v, t]) => h('option', { value: v }, t)));
    const since = h('input', { id: 'usage-since', type: 'date' });
    const out = h('div', { id: 'usage-report', 'aria-live': 'polite' });
    let seq = 0;
    async function load() {
      const mine = ++seq;
      fill(out, note('Loading…'));
      try {
        const r = await api('GetUsageReport', { by: by.value, sinceDay: since.value });
        if (!ctx.alive || mine !== seq) return;
        const rows = (r && r.rows) || [];
        const keyName = by.options[by.selectedIndex].textContent.replace('By ', '');
        fill(out, rows.length ? usageTable(rows, r.total, keyName[0].toUpperCase() + keyName.slice(1), 'usage-table')
          : note('No model calls recorded in this period.'),
        rows.length ? barChart(rows.map((x) => ({ key: x.key, usage: x.usage })), 'Tokens ' + by.options[by.selectedIndex].textContent.toLowerCase(), 'usage-chart') : null);
      } catch (e) { if (ctx.alive && mine === seq) fill(out, errorLine(e.message, 'usage-error')); }
    }
    by.addEventListener('change', load);
    since.addEventListener('change', load);
    put(ctx.root, viewHead('Usage'),
      h('div', { class: 'toolbar wrap' }, h('label', { for: 'usage-by' }, 'Group'), by,
        h('label', { for: 'usage-since' }, 'Since (UTC day)'), since),
      out, subtreeUsage());
    load();
  }

  function usageTable(rows, total, keyName, id) {
    const cells = (u) => [numCell(fmtInt(u && u.calls)), numCell(fmtInt(u && u.promptTokens)),
      numCell(fmtInt(u && u.completionTokens)), numCell(fmtUsd(u && u.costUsd))];
    const sum = total || rows.reduce((a, r) => {
      const u = r.usage || {};
      return { calls: a.calls + num(u.calls), promptTokens: a.promptTokens + num(u.promptTokens), completionTokens: a.completionTokens + num(u.completionTokens), costUsd: a.costUsd + num(u.costUsd) };
    }, { calls: 0, promptTokens: 0, completionTokens: 0, costUsd: 0 });
    return h('div', { class: 'table-wrap' }, h('table', { id },
      h('thead', null, h('tr', null, [keyName, 'Calls', 'Prompt tokens', 'Completion tokens', 'Cost (USD)'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', null, rows.map((r) => h('tr', null, h('th', { scope: 'row' }, r.label || r.key), cells(r.usage)))),
      h('tfoot', null, h('tr', { class: 'total' }, h('th', { scope: 'row' }, 'Total'), cells(sum)))));
  }

  // Horizontal bars (prompt then completion tokens), each with its values written out.
  function barChart(rows, label, id) {
    const RH = 46, max = Math.max(1, ...rows.map((r) => tokensOf(r.usage)));
    const chart = svg('svg', { id, class: 'chart', width: '100%', height: rows.length * RH + 24, role: 'img', 'aria-label': label },
      svg('title', null, label));
    rows.forEach((r, i) => {
      const u = r.usage || {}, y = i * RH;
      const p = (num(u.promptTokens) / max) * 100, c = (num(u.completionTokens) / max) * 100;
      put(chart,
        svg('text', { x: 0, y: y + 15, class: 'chart-label' },
          `${r.label || r.key}: ${fmtCompact(tokensOf(u))} tokens (${fmtCompact(u.promptTokens)} prompt, ${fmtCompact(u.completionTokens)} completion), ${fmtInt(u.calls)} calls, ${fmtUsd(u.costUsd)}`),
        svg('rect', { x: '0', y: y + 22, width: p + '%', height: 14, class: 'bar-prompt' }),
        svg('rect', { x: p + '%', y: y + 22, width: c + '%', height: 14, class: 'bar-completion' }));
    });
    put(chart, svg('text', { x: 0, y: rows.length * RH + 16, class: 'chart-legend' }, 'Solid bars: prompt tokens; lighter bars with a dashed edge: completion tokens.'));
    return h('figure', { class: 'chart-box' }, chart);
  }

  function subtreeUsage() {
    const root = state.procs.get(treeRootPid());
    const tops = root ? root.kids : state.roots;
    const rows = tops.map((pid) => state.procs.get(pid)).filter(Boolean).map((n) => ({
      key: String(n.pid), label: `${n.pid} ${n.info.name || ''}`, usage: n.info.subtreeUsage || {},
    })).sort((a, b) => tokensOf(b.usage) - tokensOf(a.usage));
    return section('By subtree', 'usage-subtree',
      note('Each top-level process with all its descendants, exited ones included, as the process list holds it.'),
      rows.length ? [usageTable(rows, null, 'Process', 'usage-subtree-table'), barChart(rows, 'Tokens by subtree', 'usage-subtree-chart')]
        : note(state.tree.loaded ? 'No top-level processes.' : 'The process list is still loading.'));
  }

  // ---- inbox view

  function viewInbox(ctx) {
    const act = canAct();
    const items = new Map();      // id -> {req, el}
    const resolved = new Map();   // id -> element
    let listing = null;           // ids reported pending by a fresh watch
    const err = h('p', { id: 'inbox-error', class: 'error', role: 'alert' });
    const count = h('p', { id: 'inbox-count', class: 'muted', 'aria-live': 'polite' });
    const list = h('div', { id: 'inbox-list', class: 'inbox' });
    const done = h('div', { id: 'inbox-resolved', class: 'inbox' });
    const updateCount = () => {
      count.textContent = items.size ? `${items.size} pending ${items.size === 1 ? 'request' : 'requests'}.` : 'Nothing is waiting for an answer.';
      state.inbox = new Set(items.keys());
      showInboxBadge();
    };
    const addReq = (req) => {
      const id = num(req.id);
      if (!id || items.has(id) || resolved.has(id)) return;
      const el = inboxItem(ctx, req, act, (decision, by, text) => markResolved(id, decision, by, text));
      items.set(id, { req, el });
      put(list, el);
      updateCount();
    };
    const drop = (id) => {
      const it = items.get(id);
      if (it) { it.el.remove(); items.delete(id); updateCount(); }
      return it;
    };
    function markResolved(id, decision, by, text) {
      const it = drop(id);
      if (resolved.has(id)) return;
      const req = it ? it.req : { id };
      const el = h('div', { class: 'inbox-item resolved', 'data-testid': 'inbox-resolved-item', 'data-id': id },
        h('p', null, h('strong', null, `#${id} ${decision || 'resolved'}`), by ? ` by ${by}` : '',
          req.name ? [' — ', pidLink(req.pid), ` ${req.name}`] : '', req.tool ? [' — ', h('code', null, req.tool)] : '',
          req.question ? ` — ${req.question}` : ''),
        text ? note(text) : null);
      resolved.set(id, el);
      done.prepend(el);
      while (done.childElementCount > 50) { const last = done.lastElementChild; resolved.delete(Number(last.getAttribute('data-id'))); last.remove(); }
    }
    // The pending list from ListRequests; what it no longer holds was resolved meanwhile.
    async function list0() {
      try {
        const r = await api('ListRequests', {});
        if (!ctx.alive) return;
        const reqs = (r && r.requests) || [];
        const ids = new Set(reqs.map((q) => num(q.id)));
        for (const id of [...items.keys()]) if (!ids.has(id)) drop(id);
        for (const req of reqs) addReq(req);
      } catch (e) { if (ctx.alive) err.textContent = e.message; }
      updateCount();
    }
    put(ctx.root, viewHead('Inbox'),
      act ? null : note('Read-only: requests are shown, not answered.'),
      err, count, list, h('h2', null, 'Recently resolved'), done);
    list0().then(() => {
      if (!ctx.alive) return;
      const w = liveWatch('WatchRequests', () => { listing = new Set(); return {}; }, (c) => {
        const req = c.request;
        switch (c.change) {
          case 'pending':
            if (req) { if (listing) listing.add(num(req.id)); addReq(req); } else if (listing) {
              for (const id of [...items.keys()]) if (!listing.has(id)) drop(id);
              listing = null;
            }
            break;
          case 'asked': if (req) addReq(req); break;
          case 'resolved': if (req) markResolved(num(req.id), c.decision, c.by, c.text); break;
          case 'lagged': list0(); break;
          default:
        }
      }, { onError: (e) => { if (ctx.alive) err.textContent = e.message; } });
      ctx.cleanups.push(() => w.close());
    });
  }

  function inboxItem(ctx, req, act, onResolved) {
    const id = num(req.id), question = req.kind === 'question';
    const el = h('div', { class: 'inbox-item card', 'data-testid': 'inbox-item', 'data-id': id });
    put(el, h('h3', null, question ? 'Question' : 'Approval', ` #${id} from `, pidLink(req.pid), req.name ? ' ' + req.name : ''));
    const facts = [];
    if (question) {
      facts.push(['Question', pre(req.question) || '']);
      if (req.choices && req.choices.length) facts.push(['Choices', chips(req.choices, '')]);
    } else {
      facts.push(['Tool', h('code', null, req.tool || '?')], ['Arguments', h('pre', { class: 'json' }, pretty(req.arguments || ''))]);
      if (req.onTimeout) facts.push(['On timeout', req.onTimeout]);
    }
    facts.push(['Asked', timeEl(req.createdAtUnixMs)], ['Expires', timeEl(req.deadlineUnixMs, { none: 'never' })]);
    if (req.traceId) facts.push(['Trace', traceLink(req.traceId)]);
    put(el, kv(facts));
    if (!act) return el;

    const errEl = h('p', { class: 'error', role: 'alert' });
    const inputId = 'inbox-text-' + id;
    const text = h('input', { id: inputId, type: 'text', class: 'action', autocomplete: 'off', 'data-field': 'text',
      list: question && req.choices && req.choices.length ? inputId + '-choices' : null });
    const buttons = [];
    const btn = (action, label, verdict, cls) => {
      const b = h('button', { type: 'button', class: 'action ' + (cls || ''), 'data-action': action }, label);
      b.addEventListener('click', async () => {
        errEl.textContent = '';
        if (verdict === 'VERDICT_ANSWER' && !text.value.trim()) { errEl.textContent = 'Type an answer first.'; text.focus(); return; }
        buttons.forEach((x) => { x.disabled = true; });
        try {
          await api('Resolve', { id, verdict, text: text.value });
          if (ctx.alive) onResolved(action === 'approve' ? 'approved' : action === 'deny' ? 'denied' : 'answered', 'you', text.value);
        } catch (e) {
          if (!ctx.alive) return;
          errEl.textContent = e.message;
          buttons.forEach((x) => { x.disabled = false; });
        }
      });
      buttons.push(b);
      return b;
    };
    put(el, h('div', { class: 'field' }, h('label', { for: inputId }, question ? 'Answer' : 'Note or reason (optional)'), text),
      question && req.choices && req.choices.length ? h('datalist', { id: inputId + '-choices' }, req.choices.map((c) => h('option', { value: c }))) : null,
      h('div', { class: 'row-line' }, question ? [btn('answer', 'Answer', 'VERDICT_ANSWER', 'primary'), btn('deny', 'Decline', 'VERDICT_DENY')]
        : [btn('approve', 'Approve', 'VERDICT_APPROVE', 'primary'), btn('deny', 'Deny', 'VERDICT_DENY', 'danger')]),
      errEl);
    return el;
  }

  // ---- MCP view

  function viewMcp(ctx) {
    // RestartMcpServer needs the admin scope.
    const act = !!state.session && state.session.scope === 'admin';
    const err = h('p', { id: 'mcp-error', class: 'error', role: 'alert' });
    const statusLine = h('p', { id: 'mcp-status', role: 'status', class: 'muted' });
    const holder = h('div', { id: 'mcp-list' }, note('Loading…'));
    async function load() {
      try {
        const r = await api('ListMcpServers', {});
        if (!ctx.alive) return;
        const servers = (r && r.servers) || [];
        const head = ['Name', 'State', 'Transport', 'Target', 'Tools', 'Left out', 'Restarts', 'Last error', 'OS PID', 'Since', 'Server'];
        if (act) head.push('Actions');
        fill(holder, servers.length ? table(head, servers.map((s) => {
          const cells = [h('td', null, s.name), h('td', null, h('span', { class: 'state state-mcp-' + String(s.state).replace(/[^a-z]/g, '') }, s.state)),
            h('td', null, s.transport), h('td', { class: 'detail' }, h('code', null, s.target)), numCell(fmtInt(s.tools)),
            numCell(fmtInt(s.leftOut)), numCell(fmtInt(s.restarts)),
            h('td', { class: 'detail' }, s.lastError ? h('span', { class: 'error' }, s.lastError) : dim('none')),
            numCell(num(s.osPid) ? String(s.osPid) : '—'), h('td', null, timeEl(s.sinceUnixMs)), h('td', null, s.server || '')];
          if (act) {
            const b = h('button', { type: 'button', class: 'action small', 'data-action': 'restart-mcp', 'aria-label': 'Restart ' + s.name }, 'Restart');
            b.addEventListener('click', async () => {
              err.textContent = '';
              b.disabled = true;
              statusLine.textContent = `Restarting ${s.name}…`;
              try {
                const st = await api('RestartMcpServer', { server: s.name });
                if (ctx.alive) statusLine.textContent = `${s.name} is ${st.state}.`;
              } catch (e) { if (ctx.alive) { err.textContent = e.message; statusLine.textContent = ''; } }
              if (ctx.alive) load();
            });
            cells.push(h('td', null, b));
          }
          return h('tr', { 'data-testid': 'mcp-row', 'data-name': s.name }, cells);
        }), { id: 'mcp-table' }) : note('No MCP servers are configured.'));
      } catch (e) { if (ctx.alive) fill(holder, errorLine(e.message)); }
    }
    const reload = throttle(load, 1000);
    ctx.cleanups.push(() => reload.cancel());
    ctx.onEvent = (ev) => { if (ev.type === 'mcp_server') reload(); };
    put(ctx.root, viewHead('MCP servers'), err, statusLine, holder);
    load();
  }

  // ---- nodes of a cluster

  function viewNodes(ctx) {
    const holder = h('div', { id: 'nodes-list' }, note('Loading…'));
    async function load() {
      try {
        const r = await api('ListNodes', {});
        if (!ctx.alive) return;
        const nodes = (r && r.nodes) || [];
        const labels = (l) => {
          const keys = Object.keys(l || {}).sort();
          return keys.length ? keys.map((k) => h('code', { class: 'label' }, `${k}=${l[k]}`)) : dim('none');
        };
        fill(holder, table(['Name', 'Address', 'Epoch', 'Processes', 'Running', 'CPU', 'Labels', 'Started', 'Last heartbeat'],
          nodes.map((n) => h('tr', { 'data-testid': 'node-row', 'data-name': n.name },
            h('td', null, n.name, n.thisNode ? dim(' (this node)') : null),
            h('td', null, h('code', null, n.address)), numCell(String(num(n.epoch))),
            numCell(fmtInt(n.processes)), numCell(fmtInt(n.running)),
            numCell(num(n.cpuPercent).toFixed(1) + ' %'), h('td', null, labels(n.labels)),
            h('td', null, timeEl(n.startedUnixMs)), h('td', null, fmtDur(n.seenMsAgo) + ' ago'))),
        { id: 'nodes-table' }));
      } catch (e) { if (ctx.alive) fill(holder, errorLine(e.message)); }
    }
    // Each node's record changes with its heartbeat: read again every 2 s.
    const timer = setInterval(load, 2000);
    ctx.cleanups.push(() => clearInterval(timer));
    put(ctx.root, viewHead('Nodes'), note('The live nodes of the cluster, as this node sees them.'), holder);
    load();
  }

  // ---- routing and session

  const VIEWS = { tree: viewTree, events: viewEvents, cron: viewCron, usage: viewUsage, inbox: viewInbox, mcp: viewMcp, nodes: viewNodes, proc: viewProc, trace: viewTrace };
  const TITLES = { tree: 'Processes', events: 'Events', cron: 'Cron', usage: 'Usage', inbox: 'Inbox', mcp: 'MCP servers', nodes: 'Nodes', proc: 'Process', trace: 'Trace' };

  function teardown() {
    const v = state.view;
    if (!v) return;
    v.alive = false;
    v.onEvent = null;
    v.onProc = null;
    for (const fn of v.cleanups) { try { fn(); } catch { /* keep tearing down */ } }
    state.view = null;
  }

  function route(moveFocus) {
    if (!state.session) return;
    const m = /^#\/([a-z]+)(?:\/(.+))?$/.exec(location.hash);
    let name = m && VIEWS[m[1]] ? m[1] : 'tree';
    let arg = '';
    try { arg = m && m[2] ? decodeURIComponent(m[2]) : ''; } catch { arg = ''; }
    if ((name === 'proc' || name === 'trace') && !arg) name = 'tree';
    teardown();
    if (state.flashRoutes > 0 && --state.flashRoutes === 0) $('flash').textContent = '';
    const root = $('view');
    root.replaceChildren();
    const ctx = { name, arg, root, alive: true, cleanups: [], onEvent: null, onProc: null };
    state.view = ctx;
    document.title = `${TITLES[name]}${arg ? ' ' + arg : ''} · HiveKernel`;
    const navKey = name === 'proc' || name === 'trace' ? '' : name;
    for (const a of document.querySelectorAll('#nav a')) {
      if (a.getAttribute('href') === '#/' + navKey) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    VIEWS[name](ctx, arg);
    if (moveFocus) {
      const h1 = root.querySelector('h1');
      if (h1) h1.focus({ preventScroll: true });
    }
  }

  function stopAll() {
    teardown();
    if (state.live) { state.live.close(); state.live = null; }
    const r = state.refresh;
    for (const t of r.timers.values()) clearTimeout(t);
    r.timers.clear(); r.queue = []; r.queued.clear(); r.last.clear();
    loadTreeSoon.cancel();
    state.procs = new Map();
    state.roots = [];
    Object.assign(state.tree, { rows: [], dirty: true, selected: 0, filter: '', scrollTop: 0, loading: false, again: false, pending: [], loaded: false, error: '' });
    if (state.events.history) state.events.history.close();
    state.events = { list: [], lastSeq: 0, history: null };
    state.inbox = new Set();
    state.gone = new Set();
  }

  function showLogin(message) {
    stopAll();
    state.session = null;
    $('boot').hidden = true;
    $('app').hidden = true;
    $('login-view').hidden = false;
    $('view').replaceChildren();
    $('login-error').textContent = message || '';
    $('login-submit').disabled = false;
    const tok = $('login-token');
    tok.value = '';
    tok.focus();
    document.title = 'Sign in · HiveKernel';
  }

  function sessionEnded() {
    keepSessionKey('');
    if (state.session) showLogin('Your session has ended. Sign in again.');
  }

  function startApp(session) {
    state.session = session;
    $('boot').hidden = true;
    $('login-view').hidden = true;
    $('app').hidden = false;
    const scope = session.scope;
    const badge = $('scope-badge');
    badge.textContent = scope === 'read' ? 'read-only' : scope === 'operate' ? 'operator' : scope === 'admin' ? 'admin' : String(scope);
    badge.className = 'badge scope-' + String(scope).replace(/[^a-z]/g, '');
    $('session-pid').textContent = session.pid ? `as process ${session.pid}` : '';
    $('version').textContent = session.version ? 'v' + String(session.version).replace(/^v/, '') : '';
    setConn('connecting');
    startLive();
    loadInboxCount();
    // A node of a cluster has a Nodes view, and says which node this is.
    $('nav-nodes').hidden = !session.node;
    $('node-name').textContent = session.node ? `node ${session.node}` : '';
    route(false);
  }

  async function boot() {
    const form = $('login-form');
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const tok = $('login-token'), errEl = $('login-error'), submit = $('login-submit');
      errEl.textContent = '';
      const token = tok.value.trim();
      if (!token) { errEl.textContent = 'Enter a token.'; tok.focus(); return; }
      submit.disabled = true;
      try {
        const session = await request('/api/login', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ token }) }, true);
        tok.value = '';
        keepSessionKey(session.csrf);
        delete session.csrf;
        startApp(session);
      } catch (err) {
        errEl.textContent = err.message;
        submit.disabled = false;
        tok.select();
      }
    });
    $('logout').addEventListener('click', async () => {
      try {
        await request('/api/logout', { method: 'POST', headers: csrfHeaders(), body: '{}' }, true);
      } catch { /* signed out here anyway */ }
      keepSessionKey('');
      showLogin('');
    });
    $('skip-link').addEventListener('click', (e) => { e.preventDefault(); $('view').focus(); });
    window.addEventListener('hashchange', () => { if (state.session) route(true); });
    setInterval(tickClock, 30000);
    try {
      // A reload of this tab keeps the session; another tab signs in on its own.
      if (!sessionKey()) throw new ApiError('', 'UNAUTHENTICATED', 401);
      const session = await request('/api/session', { method: 'GET', headers: { 'X-CSRF-Token': sessionKey() } }, true);
      startApp(session);
    } catch (err) {
      showLogin(err.status === 401 ? '' : err.message);
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot); else boot();
})();

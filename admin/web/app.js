// infera configuration center console: plain JavaScript, no dependencies.
// It talks to the admin API with the admin key kept in sessionStorage (the
// tab's lifetime) and builds every settings form from GET /api/schema.
'use strict';

const S = {
  key: sessionStorage.getItem('infera.adminKey') || '',
  schema: null,
  version: null,
  timers: [],
  leaveGuard: null,
  // The users page's writes (usersWrite): one at a time, in order.
  usersQueue: Promise.resolve(),
  usersEtag: null,
  usersPending: 0,
  usersAnswered: 0,
};

// ---------- small helpers ----------
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}
const $ = (sel, root) => (root || document).querySelector(sel);
const clone = (v) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));

function toast(msg) {
  let t = $('#toast');
  if (!t) { t = h('div', { id: 'toast' }); document.body.append(t); }
  t.textContent = msg;
  t.classList.add('show');
  clearTimeout(t._timer);
  t._timer = setTimeout(() => t.classList.remove('show'), 2600);
}

// SignedOut is what api() throws once the admin API refused the key and the
// sign-in form is shown: it ends whatever the page was doing. It is no
// fault of the page, so it is kept out of the browser's console, where
// each refused call wrote "Uncaught (in promise) Error: unauthorized".
class SignedOut extends Error {}
window.addEventListener('unhandledrejection', (ev) => {
  if (ev.reason instanceof SignedOut) ev.preventDefault();
});

// apiURL makes an API path ('/api/...') relative to the page, as the
// console's own files are: a front proxy may serve the admin listener under
// a path prefix (https://host/infera-admin/), where '/api/...' reaches
// whatever the proxy serves at its root.
function apiURL(path) {
  return path.replace(/^\//, '');
}

async function api(method, path, body, headers) {
  const opts = { method, headers: Object.assign({ Authorization: 'Bearer ' + S.key }, headers || {}) };
  if (body !== undefined) {
    opts.body = typeof body === 'string' ? body : JSON.stringify(body);
    opts.headers['Content-Type'] = 'application/json';
  }
  let res;
  try {
    res = await fetch(apiURL(path), opts);
  } catch (e) {
    // The router is down or restarting (or the network is): an answer like
    // any failed one, so that every page says so instead of silently
    // keeping what it showed.
    return { status: 0, ok: false, data: { error: { message: 'The admin API cannot be reached (' + e.message + '): is the router running?' } }, etag: null, text: '' };
  }
  if (res.status === 401) { logout('Your admin key was refused.'); throw new SignedOut('unauthorized'); }
  if (res.status === 429) { logout(lockedOut(res)); throw new SignedOut('locked out'); }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { raw: text }; }
  const v = res.headers.get('X-Config-Version');
  if (v) setVersion(v);
  return { status: res.status, ok: res.ok, data, etag: res.headers.get('ETag'), text };
}

// lockedOut is the message for the admin API's lockout (too many wrong keys
// from this address): every key, the right one too, is refused until then.
function lockedOut(res) {
  const wait = parseInt(res.headers.get('Retry-After') || '', 10);
  return 'Too many wrong admin keys from this address: the admin API refuses every key' +
    (wait > 0 ? ' for the next ' + wait + ' s.' : ' for a while.');
}

function errOf(r) {
  const e = (r.data && r.data.error) || {};
  return { path: e.path || '', message: e.message || ('HTTP ' + r.status) };
}

function setVersion(v) {
  S.version = v;
  const el = $('#ver');
  if (el) el.textContent = 'config v' + v;
}

// failedPage shows why a page could not be loaded, with a Retry, instead of
// an error answer rendered as if it were (empty) data.
function failedPage(active, title, r, retry) {
  layout(active, h('div', { class: 'page-head' }, h('h1', { text: title })),
    h('div', { class: 'banner error', id: 'page-error' }, 'This page could not be loaded: ', errOf(r).message, ' ',
      h('button', { type: 'button', class: 'small', id: 'retry', onclick: () => retry(), text: 'Retry' })));
}

// staleStamp marks a refreshing page's "live" stamp when a refresh failed:
// what the page shows is from the last refresh that worked.
function staleStamp(stamp, r) {
  stamp.classList.add('stale');
  stamp.textContent = 'not refreshed' + (stamp.dataset.last ? ' since ' + stamp.dataset.last : '') + ': ' + errOf(r).message;
}

function freshStamp(stamp) {
  stamp.classList.remove('stale');
  stamp.dataset.last = new Date().toLocaleTimeString();
  stamp.textContent = 'live · ' + stamp.dataset.last;
}

function clearTimers() { S.timers.forEach(clearInterval); S.timers = []; }

// ---------- login ----------
function logout(msg) {
  sessionStorage.removeItem('infera.adminKey');
  S.key = '';
  clearTimers();
  loginPage(msg);
}

function loginPage(msg) {
  const input = h('input', { type: 'password', id: 'admin-key', autocomplete: 'off', placeholder: 'Admin key' });
  const err = h('div', { class: 'banner error', id: 'login-error', text: msg || '' });
  if (!msg) err.hidden = true;
  const form = h('form', {
    onsubmit: async (ev) => {
      ev.preventDefault();
      S.key = input.value.trim();
      let r;
      try {
        r = await fetch(apiURL('/api/version'), { headers: { Authorization: 'Bearer ' + S.key } });
      } catch (e) {
        err.hidden = false;
        err.textContent = 'The admin API cannot be reached (' + e.message + '): is the router running?';
        return;
      }
      if (r.status !== 200) {
        // Anything else (421: a Host the API does not answer for) says why.
        let why = '';
        try { why = ((await r.json()).error || {}).message || ''; } catch (e) { /* not JSON */ }
        err.hidden = false;
        err.textContent = r.status === 401 ? 'That key is not the admin key.'
          : r.status === 429 ? lockedOut(r) : 'The admin API answered ' + r.status + (why ? ': ' + why : '.');
        return;
      }
      sessionStorage.setItem('infera.adminKey', S.key);
      start();
    },
  },
  h('div', { class: 'field' }, h('label', { for: 'admin-key', text: 'Admin key' }), input,
    h('div', { class: 'help', text: 'The --admin-key (or --api-key) the router was started with. Kept for this tab only.' })),
  h('div', { class: 'actions' }, h('button', { class: 'primary', type: 'submit', id: 'login', text: 'Sign in' })));
  $('#app').replaceChildren(h('div', { class: 'login' },
    h('h1', { text: 'infera' }), h('p', { class: 'lede', text: 'Configuration center' }),
    h('div', { class: 'card' }, err, form)));
  input.focus();
}

// ---------- shell ----------
const PAGES = [
  { group: 'Overview', items: [['fleet', 'Fleet'], ['rules', 'Rule hit counters'], ['audit', 'Audit log']] },
];

async function start() {
  if (!S.key) return loginPage();
  const [schema, ver] = await Promise.all([api('GET', '/api/schema'), api('GET', '/api/version')]);
  if (!schema.ok || !ver.ok) {
    $('#app').replaceChildren(h('div', { class: 'login' }, h('h1', { text: 'infera' }),
      h('div', { class: 'card' }, h('div', { class: 'banner error', id: 'start-error' }, 'The console cannot start: ', errOf(schema.ok ? ver : schema).message),
        h('div', { class: 'actions' }, h('button', { class: 'primary', id: 'retry', onclick: () => start(), text: 'Retry' })))));
    return;
  }
  S.schema = schema.data.sections;
  S.info = ver.data;
  window.addEventListener('hashchange', route);
  route();
}

function nav(active) {
  const groups = {};
  const order = ['Scheduling', 'Routing', 'Protection', 'Advanced', 'Fleet'];
  for (const s of S.schema) {
    if (Object.hasOwn(ownPage, s.key)) continue;
    (groups[s.group || 'Advanced'] = groups[s.group || 'Advanced'] || []).push(['section/' + s.key, s.label]);
  }
  const link = ([href, label]) => h('a', { href: '#/' + href, class: active === href ? 'active' : null, 'data-nav': href, text: label });
  const side = h('nav', { class: 'side' },
    h('div', { class: 'brand' }, 'infera', h('small', { text: 'configuration center' })),
    h('div', { class: 'nav-group', text: 'Overview' }), PAGES[0].items.map(link), link(['backup', 'Backup & restore']),
    h('div', { class: 'nav-group', text: 'Users' }), link(['users', 'Users & keys']), link(['section/user_limit', 'Quota templates']),
    order.filter((g) => groups[g]).map((g) => [h('div', { class: 'nav-group', text: g }), groups[g].map(link)]),
    h('div', { class: 'foot' },
      h('div', { id: 'ver', text: S.version ? 'config v' + S.version : '' }),
      h('div', { text: 'storage: ' + (S.info ? S.info.storage : '') }),
      h('button', { class: 'small', id: 'logout', onclick: () => logout(), text: 'Sign out' })));
  return side;
}

function layout(active, ...content) {
  const main = h('main', { class: 'main' }, ...content);
  $('#app').replaceChildren(h('div', { class: 'shell' }, nav(active), main));
  return main;
}

// ownPage names the sections the console edits on a page of their own,
// never as a settings form: users holds each user's stored key hashes,
// which the console never shows (Users & keys shows keys by id), so
// #/section/users opens that page.
const ownPage = { users: 'users' };

function route() {
  if (document.body.classList.contains('dirty') && location.hash !== S.hash) {
    if (!confirm('Discard your unsaved changes?')) { history.replaceState(null, '', S.hash || '#/fleet'); return; }
  }
  S.hash = location.hash;
  clearTimers();
  document.body.classList.remove('dirty');
  const hash = location.hash.replace(/^#\//, '') || 'fleet';
  let [page, arg] = hash.split('/');
  if (page === 'section' && Object.hasOwn(ownPage, arg)) {
    page = ownPage[arg];
    history.replaceState(null, '', '#/' + page);
    S.hash = location.hash;
  }
  if (page === 'section' && arg) return sectionPage(arg);
  if (page === 'users') return usersPage();
  if (page === 'backup') return backupPage();
  if (page === 'rules') return rulesPage();
  if (page === 'audit') return auditPage();
  return fleetPage();
}

window.addEventListener('beforeunload', (ev) => {
  if (document.body.classList.contains('dirty')) { ev.preventDefault(); ev.returnValue = ''; }
});

// ---------- fleet ----------
function pctText(x) { return x < 0 || x === undefined || x === null ? '–' : (x * 100).toFixed(1) + '%'; }
function badge(text, kind) { return h('span', { class: 'badge ' + (kind || ''), text }); }

async function fleetPage() {
  const stats = h('div', { class: 'stats' });
  const body = h('tbody');
  const stamp = h('span', { class: 'live', id: 'fleet-live', text: 'live' });
  layout('fleet',
    h('div', { class: 'page-head' }, h('h1', { text: 'Fleet' }), stamp),
    h('p', { class: 'lede', text: 'Every worker the router knows, with its state, circuit breaker, load and prefix-cache hit rate. Refreshes every 2 seconds.' }),
    stats,
    h('div', { class: 'card' }, h('table', { id: 'fleet' },
      h('thead', {}, h('tr', {}, ['Worker', 'Role', 'Status', 'Breaker', 'Active req.', 'Active tokens', 'Pending', 'KV blocks', 'Hit rate', 'Requests'].map((t, i) => h('th', { class: i >= 4 ? 'num' : null, text: t })))),
      body)));
  const load = async () => {
    const r = await api('GET', '/api/fleet');
    if (!r.ok) return staleStamp(stamp, r);
    const ws = r.data.workers;
    const routable = ws.filter((w) => w.status === 'routable').length;
    const open = ws.filter((w) => w.breaker && w.breaker !== 'closed').length;
    const rates = ws.filter((w) => w.hit_rate >= 0);
    const avg = rates.length ? rates.reduce((a, w) => a + w.hit_rate, 0) / rates.length : -1;
    stats.replaceChildren(
      h('div', { class: 'stat' }, h('b', { text: ws.length }), h('span', { text: 'workers' })),
      h('div', { class: 'stat' }, h('b', { text: routable }), h('span', { text: 'routable' })),
      h('div', { class: 'stat' }, h('b', { text: open }), h('span', { text: 'breakers not closed' })),
      h('div', { class: 'stat' }, h('b', { text: pctText(avg) }), h('span', { text: 'mean hit rate' })));
    body.replaceChildren(...(ws.length ? ws.map((w) => {
      const bar = h('span', { class: 'bar' }, h('i'));
      bar.firstChild.style.width = (w.hit_rate > 0 ? w.hit_rate * 100 : 0) + '%';
      return h('tr', { 'data-worker': w.id },
        h('td', {}, h('div', { class: 'mono', text: w.id }), h('div', { class: 'muted', text: (w.models || []).join(', ') + (w.service ? ' · ' + w.service : '') })),
        h('td', { text: w.role }),
        h('td', {}, badge(w.status, w.status === 'routable' ? 'ok' : w.status === 'draining' ? 'warn' : 'bad')),
        h('td', {}, badge(w.breaker || 'closed', !w.breaker || w.breaker === 'closed' ? 'ok' : w.breaker === 'open' ? 'bad' : 'warn')),
        h('td', { class: 'num', text: w.active_requests }),
        h('td', { class: 'num', text: w.active_tokens }),
        h('td', { class: 'num', text: w.pending_requests }),
        h('td', { class: 'num', text: w.kv_blocks >= 0 ? w.kv_blocks : '–' }),
        h('td', { class: 'num' }, h('span', { class: 'pct' }, bar, pctText(w.hit_rate))),
        h('td', { class: 'num', text: w.requests >= 0 ? w.requests + (w.failures > 0 ? ' (' + w.failures + ' failed)' : '') : '–' }));
    }) : [h('tr', {}, h('td', { colspan: 10, class: 'empty', text: 'No workers yet.' }))]));
    freshStamp(stamp);
  };
  await load();
  S.timers.push(setInterval(load, 2000));
}

async function rulesPage() {
  const body = h('tbody');
  const stamp = h('span', { class: 'live', id: 'rules-live', text: 'live' });
  layout('rules',
    h('div', { class: 'page-head' }, h('h1', { text: 'Rule hit counters' }), stamp),
    h('p', { class: 'lede', text: 'How often each rule matched and what it decided. In dry-run mode rules are evaluated and counted but block nothing: observe first, then enforce.' }),
    h('div', { class: 'card' }, h('table', { id: 'rules' },
      h('thead', {}, h('tr', {}, h('th', { text: 'Rule' }), h('th', { text: 'Result' }), h('th', { text: 'Mode' }), h('th', { class: 'num', text: 'Hits' }))), body)));
  const load = async () => {
    const r = await api('GET', '/api/rules');
    if (!r.ok) return staleStamp(stamp, r);
    const rs = r.data.rules;
    body.replaceChildren(...(rs.length ? rs.map((x) => h('tr', {},
      h('td', { class: 'mono', text: x.rule }),
      h('td', {}, badge(x.result, x.result === 'pass' ? 'ok' : x.result === 'block' ? 'bad' : 'warn')),
      h('td', {}, x.dry_run ? badge('dry run', 'warn') : badge('enforced')),
      h('td', { class: 'num', text: x.count }))) : [h('tr', {}, h('td', { colspan: 4, class: 'empty', text: 'No rule has been evaluated yet.' }))]));
    freshStamp(stamp);
  };
  await load();
  S.timers.push(setInterval(load, 2000));
}

// auditChanges is an audit entry's changes cell: the first 12 listed, and
// how many more (those listed past 12, and the ones the entry left out,
// more). The list may be empty or absent with more > 0: that read
// changes.length of null, or counted 12 fewer than there were.
function auditChanges(changes, more) {
  const shown = changes.slice(0, 12);
  const rest = changes.length - shown.length + more;
  return h('td', {}, shown.map((c) => h('div', { class: 'mono' }, c.path + ': ', h('span', { class: 'muted', text: c.old }), ' → ', c.new)),
    rest > 0 ? h('div', { class: 'muted', text: '… ' + rest + ' more' }) : null);
}

async function auditPage() {
  const r = await api('GET', '/api/audit?limit=200');
  if (location.hash !== '#/audit') return; // left while the log loaded
  if (!r.ok) return failedPage('audit', 'Audit log', r, auditPage);
  const rows = (r.data.entries || []).map((e) => h('tr', {},
    h('td', { class: 'mono', text: new Date(e.time).toLocaleString() }),
    h('td', { text: 'v' + e.version }),
    h('td', {}, h('div', { text: e.who }), h('div', { class: 'muted', text: e.remote || '' })),
    h('td', { text: e.action }),
    auditChanges(e.changes || [], e.more || 0)));
  layout('audit', h('div', { class: 'page-head' }, h('h1', { text: 'Audit log' })),
    h('p', { class: 'lede', text: 'Every change of the management data: who (which key, from where), when, and what changed. Secrets appear only as fingerprints.' }),
    h('div', { class: 'card' }, h('table', { id: 'audit' }, h('thead', {}, h('tr', {}, ['When', 'Version', 'Who', 'Action', 'Changes'].map((t) => h('th', { text: t })))),
      h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: 5, class: 'empty', text: 'No change yet.' }))))));
}

// ---------- generic settings forms ----------
// A form edits a copy of the section's value (model); every input writes
// straight into it. Each field's wrapper carries data-path (the setting's
// JSON path) so that a validation error from the API lands next to it.

function fmtDefault(f) {
  if (f.default === undefined || f.default === null || f.kind === 'secret') return null;
  let d = f.default;
  if (Array.isArray(d)) d = d.length ? d.join(', ') : 'none';
  else if (typeof d === 'boolean') d = d ? 'on' : 'off';
  else if (d === '') return null;
  return 'Default: ' + d + (f.unit && f.unit !== '%' ? ' ' + f.unit : f.unit === '%' ? '%' : '');
}

function markDirty() { document.body.classList.add('dirty'); const st = $('#save-status'); if (st) st.textContent = 'Unsaved changes'; }

function leafInput(f, obj, path, onchange) {
  const id = 'f-' + path.replace(/[^a-zA-Z0-9_-]/g, '_');
  const set = (v) => { obj[f.key] = v; markDirty(); if (onchange) onchange(); };
  const cur = obj[f.key];
  switch (f.kind) {
    case 'bool': {
      const cb = h('input', { type: 'checkbox', id, checked: !!cur, onchange: (e) => set(e.target.checked) });
      return h('label', { class: 'switch' }, cb, h('span', { class: 'track' }), h('span', { text: cur ? 'On' : 'Off', class: 'muted' }));
    }
    case 'int':
    case 'float': {
      const inp = h('input', {
        type: 'number', id, step: f.kind === 'int' ? '1' : 'any', value: cur === undefined || cur === null ? '' : String(cur),
        oninput: (e) => { const v = e.target.value; set(v === '' ? null : Number(v)); },
      });
      return f.unit ? h('div', { class: 'inrow' }, inp, h('span', { class: 'unit', text: f.unit })) : inp;
    }
    case 'enum': {
      const opts = f.options.slice();
      if (cur !== undefined && cur !== null && !opts.includes(cur)) opts.unshift(cur);
      return h('select', { id, onchange: (e) => set(e.target.value) },
        opts.map((o) => h('option', { value: o, selected: o === cur, text: o === '' ? '(default)' : o })));
    }
    case 'secret': {
      const isSet = typeof cur === 'string' && cur.startsWith('***');
      let keep = isSet; // an empty field keeps the set secret, until Remove
      const inp = h('input', {
        type: 'password', id, autocomplete: 'off', value: isSet ? '' : (cur || ''),
        placeholder: isSet ? '•••••••• set (' + cur.slice(3) + ') — type to replace' : 'key, env:NAME or file:PATH',
        oninput: (e) => set(e.target.value === '' && keep ? cur : e.target.value),
      });
      if (!isSet && cur) inp.type = 'text'; // a reference such as env:NAME is not secret
      if (!isSet) return inp;
      const remove = h('button', {
        type: 'button', class: 'small', 'data-clear': path, text: 'Remove', title: 'Remove the secret (on Save)',
        onclick: () => { keep = false; inp.value = ''; inp.placeholder = 'removed on Save — or type a new one'; remove.disabled = true; set(''); },
      });
      return h('div', { class: 'inrow' }, inp, remove);
    }
    case 'strings': {
      const arr = Array.isArray(cur) ? cur : [];
      if (f.options && f.options.length) {
        return h('div', { class: 'checks', id }, f.options.map((o) => h('label', {},
          h('input', {
            type: 'checkbox', checked: arr.includes(o), onchange: (e) => {
              const now = (Array.isArray(obj[f.key]) ? obj[f.key] : []).filter((x) => x !== o);
              if (e.target.checked) now.push(o);
              set(f.options.filter((x) => now.includes(x)));
            },
          }), o)));
      }
      return h('input', {
        type: 'text', id, value: arr.join(', '), placeholder: 'comma-separated',
        oninput: (e) => set(e.target.value.split(',').map((s) => s.trim()).filter(Boolean)),
      });
    }
    default:
      return h('input', { type: 'text', id, value: cur === undefined || cur === null ? '' : String(cur), oninput: (e) => set(e.target.value) });
  }
}

function fieldBox(f, obj, path, ctx) {
  if (f.kind === 'object') return objectBox(f, obj[f.key] = obj[f.key] || {}, path, ctx);
  if (f.kind === 'list') return listBox(f, obj, path, ctx);
  const onchange = f.percent && ctx && ctx.updatePct ? ctx.updatePct : null;
  const input = leafInput(f, obj, path, onchange);
  const box = h('div', { class: 'field' + (f.kind === 'strings' && f.options ? ' wide' : ''), 'data-path': path },
    h('label', { for: 'f-' + path.replace(/[^a-zA-Z0-9_-]/g, '_'), text: f.label }), input,
    f.percent ? h('div', { class: 'pct', 'data-pct': path }) : null,
    f.help ? h('div', { class: 'help', text: f.help }) : null,
    fmtDefault(f) && !path.includes('[') ? h('div', { class: 'def', text: fmtDefault(f) }) : null,
    h('div', { class: 'err' }));
  return box;
}

function objectBox(f, obj, path, ctx) {
  const fs = h('fieldset', { class: 'field wide', 'data-path': path }, h('legend', { text: f.label }),
    f.help ? h('div', { class: 'help', text: f.help }) : null,
    h('div', { class: 'grid' }, f.fields.map((sub) => fieldBox(sub, obj, path + '.' + sub.key, ctx))),
    h('div', { class: 'err' }));
  return fs;
}

function listBox(f, obj, path, ctx) {
  if (!Array.isArray(obj[f.key])) obj[f.key] = [];
  const arr = obj[f.key];
  const wrap = h('div', { class: 'field wide', 'data-path': path });
  const pctField = f.fields.find((x) => x.percent);
  const itemName = f.item_label || f.label.replace(/s$/, '') || 'Item';
  const updatePct = () => {
    if (!pctField) return;
    const sum = arr.reduce((a, it) => a + (Number(it[pctField.key]) > 0 ? Number(it[pctField.key]) : 0), 0);
    arr.forEach((it, i) => {
      const el = wrap.querySelector('[data-pct="' + path + '[' + i + '].' + pctField.key + '"]');
      if (!el) return;
      const w = Number(it[pctField.key]) > 0 ? Number(it[pctField.key]) : 0;
      const p = sum > 0 ? (w / sum) * 100 : 0;
      const bar = h('span', { class: 'bar' }, h('i'));
      bar.firstChild.style.width = p + '%';
      el.replaceChildren(bar, h('span', { text: (Math.round(p * 10) / 10) + '%' }));
    });
  };
  const render = () => {
    const items = arr.map((it, i) => {
      const p = path + '[' + i + ']';
      const title = it.name || it.model || it.service || it.pattern || it.id || it.url || it.period || (it.start ? it.start + '–' + (it.end || '') : '') || (it.local ? 'Local service' : '');
      const move = (d) => { const j = i + d; if (j < 0 || j >= arr.length) return; [arr[i], arr[j]] = [arr[j], arr[i]]; markDirty(); render(); };
      return h('div', { class: 'item', 'data-path': p, 'data-item': i },
        h('div', { class: 'item-head' },
          h('span', { class: 'title', text: itemName + ' ' + (i + 1) + (title ? ' · ' + title : '') }),
          h('button', { type: 'button', class: 'small', title: 'Move up', disabled: i === 0, onclick: () => move(-1), text: '↑' }),
          h('button', { type: 'button', class: 'small', title: 'Move down', disabled: i === arr.length - 1, onclick: () => move(1), text: '↓' }),
          h('button', { type: 'button', class: 'small danger', onclick: () => { arr.splice(i, 1); markDirty(); render(); }, text: 'Remove' })),
        h('div', { class: 'grid' }, f.fields.map((sub) => fieldBox(sub, it, p + '.' + sub.key, { updatePct }))),
        h('div', { class: 'err' }));
    });
    wrap.replaceChildren(...[
      h('label', { text: f.label }),
      f.help ? h('div', { class: 'help', text: f.help }) : null,
      h('div', { class: 'list' }, items.length ? items : h('div', { class: 'empty', text: 'None.' })),
      h('div', { class: 'err' }),
      h('div', { class: 'actions' }, h('button', {
        type: 'button', class: 'small', 'data-add': path,
        onclick: () => { arr.push(clone(f.item) || {}); markDirty(); render(); }, text: '+ Add ' + itemName.toLowerCase(),
      }))].filter(Boolean));
    updatePct();
  };
  render();
  return wrap;
}

// badNumber finds a number field holding what the browser cannot read as
// a number ("5e", "1..5", "1e400"): its value reads as "", as a cleared
// field's does.
function badNumber(root) {
  for (const inp of root.querySelectorAll('input[type=number]')) {
    if (inp.validity.badInput) {
      const box = inp.closest('[data-path]');
      return { path: box ? box.dataset.path : '', message: 'not a number' };
    }
  }
  return null;
}

function clearErrors(root) {
  root.querySelectorAll('.invalid').forEach((el) => el.classList.remove('invalid'));
  root.querySelectorAll('.err').forEach((el) => { el.textContent = ''; });
}

// showError puts the message next to the setting it names (or its
// nearest enclosing group) and in a banner at the top.
function showError(root, banner, e) {
  clearErrors(root);
  let p = e.path;
  let el = null;
  while (p) {
    el = root.querySelector('[data-path="' + CSS.escape(p) + '"]');
    if (el) break;
    const cut = Math.max(p.lastIndexOf('.'), p.lastIndexOf('['));
    p = cut > 0 ? p.slice(0, cut) : '';
  }
  if (el) {
    el.classList.add('invalid');
    const slot = el.querySelector(':scope > .err');
    if (slot) slot.textContent = e.message;
    el.scrollIntoView({ block: 'center', behavior: 'instant' });
    const inp = el.querySelector('input, select');
    if (inp) inp.focus({ preventScroll: true });
  }
  banner.className = 'banner error';
  banner.hidden = false;
  banner.replaceChildren(e.path ? h('code', { text: e.path }) : '', e.path ? ' ' : '', e.message);
}

async function sectionPage(key) {
  document.body.classList.remove('dirty');
  const f = Object.hasOwn(ownPage, key) ? null : S.schema.find((s) => s.key === key);
  if (!f) return layout('', h('div', { class: 'banner error', text: 'No section ' + key }));
  const r = await api('GET', '/api/config/' + key);
  if (location.hash !== '#/section/' + key) return; // left while the section loaded
  if (!r.ok) return failedPage('section/' + key, f.label, r, () => sectionPage(key));
  let etag = r.etag;
  const holder = { [key]: r.data };
  const banner = h('div', { class: 'banner error', id: 'form-error', hidden: true });
  const form = h('form', { id: 'section-form', 'data-section': key, onsubmit: (ev) => { ev.preventDefault(); save(); } });
  const status = h('span', { class: 'status', id: 'save-status', text: 'Saved · version ' + S.version });
  const render = () => {
    form.replaceChildren(f.kind === 'object'
      ? h('div', { class: 'card' }, h('div', { class: 'grid' }, f.fields.map((sub) => fieldBox(sub, holder[key], key + '.' + sub.key))))
      : h('div', { class: 'card' }, listBox(f, holder, key)));
  };
  // saving is true while a Save is on its way: a second click then sends
  // nothing (sent with the same ETag, it was refused 409 and the page said
  // "Not saved" about a section that was saved).
  let saving = false;
  const save = async () => {
    if (saving) return;
    const bad = badNumber(form);
    if (bad) { // sent, it would read as cleared: the default, saved
      showError(form, banner, bad);
      status.textContent = 'Not saved: fix the highlighted setting';
      return;
    }
    const sent = JSON.stringify(holder[key]);
    saving = true;
    status.textContent = 'Saving…';
    let res;
    try {
      res = await api('PUT', '/api/config/' + key, sent, { 'If-Match': etag });
    } finally {
      saving = false;
    }
    if (res.status === 200) {
      etag = res.etag;
      banner.hidden = true;
      clearErrors(form);
      toast('Saved: ' + f.label + ' is live (version ' + S.version + ')');
      if (JSON.stringify(holder[key]) !== sent) {
        // Edited while the Save was on its way: those edits stay on the
        // form, unsaved, for the next Save (with the new ETag). Replacing
        // the form with the answer dropped them without a word.
        document.body.classList.add('dirty');
        status.textContent = 'Saved version ' + S.version + ' · changes made while saving are not saved yet';
        return;
      }
      holder[key] = res.data;
      render();
      document.body.classList.remove('dirty');
      status.textContent = 'Saved · version ' + S.version;
    } else if (res.status === 409 && res.etag && res.etag !== etag) {
      // Another ETag: the configuration changed meanwhile. (Another 409,
      // such as a broken hand edit of the config file, says why below:
      // reloading would not help.)
      banner.className = 'banner warn';
      banner.hidden = false;
      banner.replaceChildren('Someone changed the configuration since you opened this page (now version ' + (res.data.error.version || '?') + '). ',
        h('button', { type: 'button', class: 'small', onclick: () => sectionPage(key), text: 'Reload (discards your edits)' }));
    } else {
      const e = errOf(res);
      showError(form, banner, e);
      status.textContent = e.path ? 'Not saved: fix the highlighted setting' : 'Not saved';
    }
  };
  render();
  const main = layout('section/' + key,
    h('div', { class: 'page-head' }, h('h1', { text: f.label }), h('span', { class: 'tag', text: key })),
    f.help ? h('p', { class: 'lede', text: f.help }) : null,
    banner, form,
    h('div', { class: 'savebar' }, status,
      h('button', { type: 'button', id: 'discard', onclick: () => sectionPage(key), text: 'Discard changes' }),
      h('button', { type: 'button', class: 'primary', id: 'save', onclick: save, text: 'Save' })));
  if (key === 'user_limit') main.insertBefore(h('p', { class: 'lede' }, 'Bind templates to users on ', h('a', { href: '#/users', text: 'Users & keys' }), '.'), banner);
}

// ---------- users ----------

// usersWrite sends a write of the users page after the ones before it,
// with the ETag the one before it was answered (If-Match, when
// conditional): edits made faster than the API answers (each write stores
// the whole config: about 200 ms at 10,000 users) land one after another.
// Sent at once, the second carried the ETag from before the first and was
// refused 409, "changed meanwhile", about the operator's own edit.
function usersWrite(method, path, body, conditional) {
  S.usersPending++;
  const run = S.usersQueue.then(async () => {
    const res = await api(method, path, body, conditional ? { 'If-Match': S.usersEtag } : undefined);
    S.usersAnswered++;
    if (res.ok && res.etag) S.usersEtag = res.etag;
    return res;
  }).finally(() => { S.usersPending--; });
  S.usersQueue = run.catch(() => {});
  return run;
}

async function usersPage() {
  // A re-render after an edit (whose answer may come after the user left
  // the page) must not replace the page opened meanwhile.
  const here = () => location.hash === '#/users';
  if (!here()) return;
  const answered = S.usersAnswered;
  const [ur, tr] = await Promise.all([api('GET', '/api/users'), api('GET', '/api/templates')]);
  if (!here()) return;
  if (!ur.ok || !tr.ok) return failedPage('users', 'Users & API keys', ur.ok ? tr : ur, usersPage);
  // The list's ETag, unless a write answered since it was asked for (its
  // ETag may be the newer) or one is still to come (it will set its own).
  if (!S.usersPending && S.usersAnswered === answered) S.usersEtag = ur.etag;
  const templates = (tr.data && tr.data.templates || []).map((t) => t.name);
  const banner = h('div', { class: 'banner error', id: 'users-error', hidden: true });
  const fail = (res) => { const e = errOf(res); banner.hidden = false; banner.replaceChildren(e.path ? h('code', { text: e.path }) : '', ' ', e.message); };
  const after = async (res, okStatus) => {
    if (res.status === okStatus) return true;
    if (res.status === 409 && res.etag && res.etag !== S.usersEtag) { banner.hidden = false; banner.className = 'banner warn'; banner.textContent = 'The configuration changed meanwhile: reloaded, please retry.'; setTimeout(usersPage, 1200); return false; }
    fail(res); return false;
  };
  const tplSelect = (cur, onchange, id) => h('select', { id, onchange },
    h('option', { value: '', selected: !cur, text: '(default template)' }),
    templates.map((t) => h('option', { value: t, selected: t === cur, text: t })));
  const rows = (ur.data.users || []).map((u) => h('tr', { 'data-user': u.name },
    h('td', { class: 'mono', text: u.name }),
    h('td', {}, tplSelect(u.template, async (e) => {
      if (await after(await usersWrite('PUT', '/api/users/' + encodeURIComponent(u.name), { template: e.target.value }, true), 200)) { toast('Template of ' + u.name + ' updated'); usersPage(); }
    })),
    h('td', {}, h('label', { class: 'switch' }, h('input', {
      type: 'checkbox', checked: u.enabled, onchange: async (e) => {
        if (await after(await usersWrite('PUT', '/api/users/' + encodeURIComponent(u.name), { enabled: e.target.checked }, true), 200)) { toast(u.name + (e.target.checked ? ' enabled' : ' disabled')); usersPage(); }
      },
    }), h('span', { class: 'track' }))),
    h('td', {}, u.key_ids.length ? u.key_ids.map((id) => h('span', { class: 'chip', title: 'key id' }, id, h('button', {
      title: 'Revoke', text: '×', onclick: async () => {
        if (!confirm('Revoke key ' + id + ' of ' + u.name + '? Clients using it get 401 at once.')) return;
        if (await after(await usersWrite('DELETE', '/api/users/' + encodeURIComponent(u.name) + '/keys/' + id, undefined, true), 200)) { toast('Key revoked'); usersPage(); }
      },
    }))) : h('span', { class: 'muted', text: 'no key' })),
    h('td', {}, h('input', {
      type: 'text', class: 'models', 'data-models': u.name, value: (u.models || []).join(', '), placeholder: 'every model',
      title: 'Models this user may call: names or * patterns, comma-separated, case-insensitive. Empty: every model.',
      onchange: async (e) => {
        const models = e.target.value.split(',').map((m) => m.trim()).filter((m) => m);
        if (await after(await usersWrite('PUT', '/api/users/' + encodeURIComponent(u.name), { models }, true), 200)) { toast('Models of ' + u.name + ' updated'); usersPage(); }
      },
    })),
    h('td', { class: 'usage', 'data-usage': u.name }, h('span', { class: 'muted', text: '…' })),
    h('td', {}, h('div', { class: 'actions' },
      h('button', {
        class: 'small', text: 'New key', onclick: async () => {
          const res = await usersWrite('POST', '/api/users/' + encodeURIComponent(u.name) + '/keys');
          if (await after(res, 201)) showKey(u.name, res.data.key);
        },
      }),
      h('button', {
        class: 'small danger', text: 'Delete', onclick: async () => {
          if (!confirm('Delete user ' + u.name + '?')) return;
          if (await after(await usersWrite('DELETE', '/api/users/' + encodeURIComponent(u.name), undefined, true), 204)) { toast('User deleted'); usersPage(); }
        },
      })))));
  const name = h('input', { type: 'text', id: 'new-user-name', placeholder: 'e.g. alice', autocomplete: 'off' });
  const tpl = tplSelect('', null, 'new-user-template');
  const enabled = h('input', { type: 'checkbox', id: 'new-user-enabled', checked: true });
  const nameBox = h('div', { class: 'field', 'data-path': 'name' }, h('label', { for: 'new-user-name', text: 'Name' }), name,
    h('div', { class: 'help', text: '1–64 of A–Z a–z 0–9 . _ @ + -, starting with a letter or digit.' }), h('div', { class: 'err' }));
  const createForm = h('form', {
    id: 'create-user', onsubmit: async (ev) => {
      ev.preventDefault();
      clearErrors(createForm);
      const res = await usersWrite('POST', '/api/users', { name: name.value.trim(), template: tpl.value, enabled: enabled.checked });
      if (res.status === 201) { showKey(res.data.user.name, res.data.key, true); return; }
      const e = errOf(res);
      if (/^users\[\d+\]\.name$/.test(e.path) || e.path === 'name' || res.status === 409) {
        nameBox.classList.add('invalid'); nameBox.querySelector('.err').textContent = e.message;
      } else fail(res);
    },
  }, h('div', { class: 'grid' }, nameBox,
    h('div', { class: 'field' }, h('label', { for: 'new-user-template', text: 'Quota template' }), tpl, h('div', { class: 'help', text: 'Empty: the default template.' })),
    h('div', { class: 'field' }, h('label', { text: 'Enabled' }), h('label', { class: 'switch' }, enabled, h('span', { class: 'track' })))),
  h('div', { class: 'actions' }, h('button', { class: 'primary', type: 'submit', id: 'create-user-btn', text: 'Create user and key' })));
  layout('users', h('div', { class: 'page-head' }, h('h1', { text: 'Users & API keys' })),
    h('p', { class: 'lede', text: 'API keys identify users; only salted hashes are stored, so a key is shown once, when it is created. Users without a bound quota template use the default template.' }),
    banner,
    h('div', { class: 'card' }, h('h2', { text: 'New user' }), createForm),
    h('div', { class: 'card' }, h('table', { id: 'users' },
      h('thead', {}, h('tr', {}, ['User', 'Quota template', 'Enabled', 'Keys (by id)', 'Models', 'Usage now', ''].map((t) => h('th', { text: t })))),
      h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: 7, class: 'empty', text: 'No users yet.' }))))));
  // Each user's standing against its limits, from the router's counters:
  // for the rows on screen (or scrolled to), a few requests at a time, for
  // this rendering of the page only. (One request per user at once overran
  // the browser's queue with thousands of users, failing most of them, and
  // each edit's re-render queued as many again ahead of the next edit.)
  const gen = S.usersGen = (S.usersGen || 0) + 1;
  const queue = [];
  let running = 0;
  const seen = new IntersectionObserver((entries) => {
    for (const en of entries) {
      if (en.isIntersecting) { seen.unobserve(en.target); queue.push(en.target); }
    }
    pump();
  }, { rootMargin: '300px' });
  const pump = () => {
    if (S.usersGen !== gen || !here()) { seen.disconnect(); return; }
    while (running < 4 && queue.length) {
      const cell = queue.shift();
      running++;
      api('GET', '/api/users/' + encodeURIComponent(cell.dataset.usage) + '/usage').then((res) => {
        if (cell.isConnected) cell.replaceChildren(...usageChips(res));
      }).finally(() => { running--; pump(); });
    }
  };
  document.querySelectorAll('td[data-usage]').forEach((td) => seen.observe(td));
}

// usageChips renders GET /api/users/{name}/usage: what is left of each
// rate bucket, each quota window's count against its maximum, the slots.
function usageChips(res) {
  if (res.status !== 200) return [h('span', { class: 'muted', text: res.status === 503 ? 'unavailable' : '—' })];
  const u = res.data;
  if (!u.template) return [h('span', { class: 'muted', text: 'no limits' })];
  const n = (x) => Number(x).toLocaleString('en-US', { maximumFractionDigits: 1 });
  const out = [];
  const chip = (text, title, full) => out.push(h('span', { class: 'stat' + (full ? ' full' : ''), title, text }));
  if (u.rpm) chip('RPM ' + n(u.rpm.remaining) + '/' + n(u.rpm.limit) + ' left', 'requests left in the bucket; full again in ' + (u.rpm.reset_ms / 1000) + ' s', u.rpm.remaining === 0);
  if (u.tpm) chip('TPM ' + n(u.tpm.remaining) + '/' + n(u.tpm.limit) + ' left', 'tokens left in the bucket; full again in ' + (u.tpm.reset_ms / 1000) + ' s', u.tpm.remaining === 0);
  for (const w of u.quota || []) {
    const until = 'window ' + w.start + ' to ' + w.end;
    if (w.max_requests) chip(w.period + ' ' + n(w.requests) + '/' + n(w.max_requests) + ' req', until, w.requests >= w.max_requests);
    else chip(w.period + ' ' + n(w.requests) + ' req', until, false);
    if (w.max_tokens) chip(w.period + ' ' + n(w.tokens) + '/' + n(w.max_tokens) + ' tok', until + ' (weighted tokens)', w.tokens >= w.max_tokens);
  }
  if (u.concurrency_limit) chip('active ' + u.active + '/' + u.concurrency_limit, 'requests holding a concurrency slot; ' + u.queued + ' queued here', u.active >= u.concurrency_limit);
  if (u.dry_run) chip('dry run', 'limits are counted, nothing is refused', false);
  if (!out.length) out.push(h('span', { class: 'muted', text: 'nothing counted' }));
  return out;
}

function showKey(user, key, created) {
  const inp = h('input', { type: 'text', id: 'new-key', readonly: true, value: key });
  const back = h('div', { class: 'modal-back' }, h('div', { class: 'modal', role: 'dialog' },
    h('h2', { text: created ? 'User ' + user + ' created' : 'New key for ' + user }),
    h('p', { text: 'Copy this API key now: it is shown this once and cannot be recovered (only its hash is stored).' }),
    h('div', { class: 'keybox' }, inp, h('button', { type: 'button', onclick: async () => { inp.select(); try { await navigator.clipboard.writeText(key); toast('Copied'); } catch (e) { document.execCommand('copy'); } }, text: 'Copy' })),
    h('div', { class: 'actions' }, h('button', { class: 'primary', id: 'key-done', onclick: () => { back.remove(); usersPage(); }, text: 'I have stored it' }))));
  document.body.append(back);
  inp.select();
}

// ---------- backup ----------
function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: 'application/json' }));
  const a = h('a', { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 5000);
}

async function backupPage() {
  // A re-render after an import (its answer may come after the user left
  // the page) must not replace the page opened meanwhile.
  const here = () => location.hash === '#/backup';
  if (!here()) return;
  const r = await api('GET', '/api/backup');
  if (!here()) return;
  if (!r.ok) return failedPage('backup', 'Backup & restore', r, backupPage);
  const b = r.data;
  const redis = b.mode === 'redis';
  const banner = h('div', { class: 'banner error', id: 'backup-error', hidden: true });
  const fail = (res) => { const e = errOf(res); banner.hidden = false; banner.replaceChildren(e.path ? h('code', { text: e.path }) : '', ' ', e.message); };
  const preview = h('div', { id: 'import-preview' });
  const fileInput = h('input', { type: 'file', id: 'import-file', accept: 'application/json,.json' });
  fileInput.addEventListener('change', async () => {
    banner.hidden = true;
    const file = fileInput.files[0];
    if (!file) return;
    const text = await file.text();
    // The field lets go of the file once it is read: choosing the same
    // file again (fixed, or downloaded again) then checks it again. Kept,
    // choosing it fired no change, and a refusal stayed whatever the file
    // now held.
    fileInput.value = '';
    const dry = await api('POST', '/api/backup/import?dry_run=1', text);
    if (!dry.ok) {
      const e = errOf(dry);
      banner.hidden = false;
      banner.replaceChildren(file.name + ' cannot be imported; nothing was changed. ', e.path ? h('code', { text: e.path }) : '', ' ', e.message);
      preview.replaceChildren();
      return;
    }
    const ch = dry.data.changes || [];
    const nch = ch.length + (dry.data.more || 0);
    preview.replaceChildren(h('div', { class: 'banner info' },
      h('div', { text: file.name + ' is valid. ' + (nch ? nch + ' setting(s) will change' + (dry.data.more ? ' (the first ' + ch.length + ' listed)' : '') + ':' : 'It matches the current configuration.') }),
      ch.length ? h('div', { class: 'changes' }, h('table', {}, h('tbody', {}, ch.slice(0, 200).map((c) => h('tr', {}, h('td', { class: 'mono', text: c.path }), h('td', { class: 'mono muted', text: c.old }), h('td', { class: 'mono', text: c.new })))))) : null,
      h('div', { class: 'actions' }, h('button', {
        class: 'primary', id: 'import-confirm', text: redis ? 'Import to Redis' : 'Import', onclick: async () => {
          // The preview's ETag: if the config changed since, the import is refused (409), not applied unseen.
          const res = await api('POST', '/api/backup/import', text, dry.etag ? { 'If-Match': dry.etag } : undefined);
          if (res.ok) { toast('Imported: now version ' + res.data.version); backupPage(); } else fail(res);
        },
      }), h('button', { onclick: () => { preview.replaceChildren(); fileInput.value = ''; }, text: 'Cancel' }))));
  });
  const exportBtn = h('button', {
    class: 'primary', id: 'export', text: 'Export', onclick: async () => {
      const res = await api('GET', '/api/backup/export');
      if (!res.ok) return fail(res);
      download('infera-snapshot-v' + S.version + '.json', res.text);
      toast('Snapshot exported');
    },
  });
  const snapRows = (b.snapshots || []).map((s) => h('tr', {},
    h('td', { class: 'mono', text: s.name }), h('td', {}, badge(s.kind, s.kind === 'auto' ? '' : 'warn')),
    h('td', { text: new Date(s.time).toLocaleString() }), h('td', { class: 'num', text: (s.size / 1024).toFixed(1) + ' KiB' }),
    h('td', {}, h('button', {
      class: 'small', text: 'Download', onclick: async () => {
        const res = await api('GET', '/api/backup/snapshots/' + encodeURIComponent(s.name));
        if (res.ok) download(s.name, res.text); else fail(res);
      },
    }))));
  const modeText = redis
    ? 'Management data lives in Redis, which keeps its own persistence: periodic backups are off. Import to Redis migrates a snapshot file from built-in storage.'
    : b.mode === 'snapshots'
      ? 'Snapshots go to ' + b.dir + ' every ' + b.settings.interval_s + ' s when the data changed, keeping ' + b.settings.keep + ' per kind. On start the newest good snapshot is restored; with a --config file, the later of the file and the snapshot wins.'
      : 'No backup directory: start with --persist-snapshot-dir to take periodic snapshots. Export and Import work anyway.';
  layout('backup', h('div', { class: 'page-head' }, h('h1', { text: 'Backup & restore' }), h('span', { class: 'tag', text: b.mode })),
    h('p', { class: 'lede', text: modeText }),
    banner,
    h('div', { class: 'card' }, h('h2', { text: 'Export' }),
      h('p', { class: 'muted', text: 'Download a snapshot of all management data: every section, users and quota templates. API keys are in it only as salted hashes; upstream secrets are sealed with the seal key (--admin-seal-key, by default the admin key): the export restores on a gateway with the same one.' }),
      h('div', { class: 'actions' }, exportBtn, b.mode === 'snapshots' ? h('button', {
        id: 'snapshot-now', text: 'Take a snapshot now', onclick: async () => {
          const res = await api('POST', '/api/backup');
          if (res.ok) { toast('Snapshot ' + res.data.name + ' written'); backupPage(); } else fail(res);
        },
      }) : null)),
    h('div', { class: 'card' }, h('h2', { text: redis ? 'Import to Redis' : 'Import' }),
      h('p', { class: 'muted', text: 'Restore a snapshot file. It is checked whole first (format, checksum, every setting); a bad file changes nothing. ' + (b.mode === 'snapshots' ? 'The current data is saved as a manual snapshot before an import that changes it.' : '') }),
      fileInput, preview),
    b.mode === 'snapshots' ? h('div', { class: 'card' }, h('h2', { text: 'Stored snapshots' }), h('table', { id: 'snapshots' },
      h('thead', {}, h('tr', {}, ['Name', 'Kind', 'Taken', 'Size', ''].map((t) => h('th', { text: t })))),
      h('tbody', {}, snapRows.length ? snapRows : h('tr', {}, h('td', { colspan: 5, class: 'empty', text: 'None yet.' }))))) : null);
}

start();

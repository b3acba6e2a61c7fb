// The dashboard: a hash-routed single page. #/ sweeps, #/sweep/NAME, #/run/ID, #/compare/NAME[/MORE...].
import { adoptTokenFromUrl, Unauthorized } from './api.js';
import { el } from './format.js';
import * as sweeps from './pages/sweeps.js';
import * as sweep from './pages/sweep.js';
import * as run from './pages/run.js';
import * as compare from './pages/compare.js';

const view = document.getElementById('view');
const crumbs = document.getElementById('crumbs');
const alerts = document.getElementById('alerts');
const live = document.getElementById('live');

let leaveHandlers = [];
let generation = 0;

function leave() {
  for (const fn of leaveHandlers) fn();
  leaveHandlers = [];
  alerts.replaceChildren();  // a page's alerts are about what it showed
}

function showError(err) {
  if (err instanceof Unauthorized) {
    leave();  // no stream or timer keeps knocking
    live.textContent = '';
    live.classList.remove('on');
    view.replaceChildren(el('div', { class: 'error-box', id: 'unauthorized' },
      el('strong', {}, 'Not authorized: '),
      'open the URL ablate printed (it carries the token). ',
      el('span', { class: 'muted' }, '`ablate up` and `ablate serve` print it as http://HOST:PORT/?token=…')));
    return;
  }
  view.replaceChildren(el('div', { class: 'error-box', id: 'error' }, String(err.message || err)));
}

// What a page may use: breadcrumbs, timers and streams cleaned up when the page is left, alerts.
function context(gen) {
  return {
    crumbs(items) {
      crumbs.replaceChildren(...items.flatMap(([href, text]) => [' / ', href ? el('a', { href }, text) : el('span', {}, text)]));
    },
    every(ms, fn) {
      let busy = false;
      const timer = setInterval(async () => {
        if (busy || gen !== generation) return;
        busy = true;
        try { await fn(); } catch (err) { if (err instanceof Unauthorized) showError(err); } finally { busy = false; }
      }, ms);
      leaveHandlers.push(() => clearInterval(timer));
    },
    onLeave(fn) { leaveHandlers.push(fn); },
    live(on) {
      live.classList.toggle('on', on);
      live.textContent = on ? 'live' : 'reconnecting…';
    },
    alert(text, kind, href) {
      const box = el('div', { class: `alert ${kind}`, 'data-kind': kind },
        el('button', { onclick: () => box.remove(), title: 'dismiss' }, '×'),
        href ? el('a', { href }, text) : text);
      alerts.prepend(box);
      while (alerts.children.length > 6) alerts.lastChild.remove();
      if (kind !== 'diverged') setTimeout(() => box.remove(), 15000);
    },
  };
}

async function route() {
  leave();
  const gen = ++generation;
  live.textContent = '';
  live.classList.remove('on');
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const ctx = context(gen);
  try {
    if (parts[0] === 'sweep' && parts[1]) await sweep.render(view, ctx, parts[1]);
    else if (parts[0] === 'run' && parts[1]) await run.render(view, ctx, parts[1]);
    else if (parts[0] === 'compare' && parts[1]) await compare.render(view, ctx, parts[1], parts.slice(2).filter((p) => p));
    else await sweeps.render(view, ctx);
    document.body.dataset.ready = gen;
  } catch (err) {
    if (gen === generation) showError(err);
  }
}

adoptTokenFromUrl();
window.addEventListener('hashchange', route);
route();

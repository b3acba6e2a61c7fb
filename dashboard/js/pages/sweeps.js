// #/ : every sweep with its progress (runs by state), start time and ETA; then every worker that
// has not left, with its slots in use and its running runs.
import { api } from '../api.js';
import { el, time, duration, stateBadge } from '../format.js';

const ORDER = ['SUCCEEDED', 'RUNNING', 'DIVERGED', 'FAILED', 'INTERRUPTED', 'STOPPED', 'CANCELLED'];

export function progressBar(sweep) {
  const total = Math.max(1, sweep.runs);
  return el('div', { class: 'bar', title: ORDER.map((s) => `${s}: ${sweep.by_state[s]}`).join(', ') },
    ORDER.filter((s) => sweep.by_state[s] > 0).map((s) =>
      el('span', { class: s, style: `width:${(100 * sweep.by_state[s]) / total}%` })));
}

export async function render(view, ctx) {
  ctx.crumbs([]);
  const draw = async () => {
    const [{ sweeps }, { workers }] = await Promise.all([api('sweeps'), api('workers')]);
    const live = workers.filter((w) => w.state !== 'GONE');
    const workerRows = live.map((w) => {
      let resources = {};
      try { resources = JSON.parse(w.resources || '{}'); } catch { /* an older worker's */ }
      const slots = Math.max(1, resources.slots || 1);
      return el('tr', { 'data-worker': w.id },
        el('td', {}, w.name),
        el('td', {}, stateBadge(w.state)),
        el('td', {}, resources.device || 'cpu'),
        el('td', { class: 'num', 'data-slots': `${w.slots_in_use}/${slots}` },
          `${w.slots_in_use} / ${slots}`),
        el('td', { class: 'num' }, w.running),
        el('td', {}, time(w.last_seen)));
    });
    const rows = sweeps.map((s) => el('tr', { 'data-sweep': s.name },
      el('td', {}, el('a', { href: `#/sweep/${encodeURIComponent(s.name)}` }, s.name)),
      el('td', {}, stateBadge(s.state)),
      el('td', {}, progressBar(s)),
      el('td', { class: 'num' }, `${s.by_state.SUCCEEDED + s.by_state.DIVERGED + s.by_state.FAILED + s.by_state.CANCELLED + (s.by_state.STOPPED || 0)} / ${s.runs}`),
      el('td', { class: 'num' }, s.by_state.RUNNING),
      el('td', { class: 'num' }, s.by_state.DIVERGED),
      el('td', {}, time(s.created_at)),
      el('td', {}, duration(s.eta_s)),
      el('td', {}, el('a', { href: `#/compare/${encodeURIComponent(s.name)}` }, 'compare'))));
    view.replaceChildren(
      el('h1', {}, 'Sweeps'),
      sweeps.length === 0 ? el('p', { class: 'muted' }, 'No sweep yet: `ablate submit SPEC`.') :
        el('table', { id: 'sweeps' },
          el('thead', {}, el('tr', {}, ['sweep', 'state', 'progress', 'done', 'running', 'diverged',
            'started', 'ETA', ''].map((h) => el('th', {}, h)))),
          el('tbody', {}, rows)),
      el('h2', {}, 'Workers'),
      live.length === 0 ? el('p', { class: 'muted' }, 'No worker: `ablate-worker --coordinator ADDRESS`, or `ablate up`.') :
        el('table', { id: 'workers' },
          el('thead', {}, el('tr', {}, ['worker', 'state', 'device', 'slots in use', 'running',
            'last seen'].map((h) => el('th', {}, h)))),
          el('tbody', {}, workerRows)));
  };
  await draw();
  ctx.every(2000, draw);
}

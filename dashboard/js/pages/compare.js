// #/compare/NAME : the `ablate table` comparison, sortable, mean ± std over seeds.
import { api } from '../api.js';
import { el, num, count } from '../format.js';

const COLUMNS = [
  { key: 'variant', label: 'variant', text: (r) => r.variant + (r.axes ? ` (${r.axes})` : '') },
  { key: 'n', label: 'n', num: true, value: (r) => r.n, text: (r) => `${r.n}/${r.runs}` },
  { key: 'val_loss', label: 'val loss', ms: true, digits: 4 },
  { key: 'val_ppl', label: 'val PPL', ms: true, digits: 2 },
  { key: 'gate_score', label: 'gate score', ms: true, digits: 3 },
  { key: 'm_act', label: 'M-Act', ms: true, digits: 1 },
  { key: 'f_attn', label: 'F-Attn', ms: true, digits: 3 },
  { key: 'spike_score', label: 'spike score', ms: true, digits: 4 },
  { key: 'params_total', label: 'params', num: true, value: (r) => r.params_total, text: (r) => count(r.params_total) },
  { key: 'params_added', label: 'added', num: true, value: (r) => r.params_added, text: (r) => count(r.params_added, true) },
  { key: 'diverged', label: 'diverged', num: true, value: (r) => r.diverged, text: (r) => r.diverged },
  { key: 'failed', label: 'failed', num: true, value: (r) => r.failed, text: (r) => r.failed },
];

function meanStd(m, digits) {
  if (m.mean === null) return '—';
  if (m.std === null) return num(m.mean, digits);
  // A spread below the shown precision (float noise over identical values) reads as 0.
  const std = Math.abs(m.std) < 0.5 * 10 ** -digits ? 0 : m.std;
  return `${num(m.mean, digits)} ± ${num(std, digits)}`;
}

function sortValue(col, row) {
  if (col.ms) return row[col.key].mean;
  if (col.value) return col.value(row);
  return col.text(row);
}

export async function render(view, ctx, name) {
  ctx.crumbs([[`#/sweep/${encodeURIComponent(name)}`, name], [null, 'compare']]);
  const table = await api(`sweeps/${encodeURIComponent(name)}/table`);
  let sort = { key: 'val_loss', dir: 1 };
  const tbody = el('tbody');
  const heads = COLUMNS.map((c) => el('th', {
    class: `sortable ${c.ms || c.num ? 'num' : ''}`, 'data-key': c.key,
    onclick: () => { sort = { key: c.key, dir: sort.key === c.key ? -sort.dir : 1 }; draw(); },
  }, c.label));
  function draw() {
    const col = COLUMNS.find((c) => c.key === sort.key);
    const rows = [...table.rows].sort((a, b) => {
      const x = sortValue(col, a), y = sortValue(col, b);
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * sort.dir;
    });
    heads.forEach((h) => h.classList.toggle('sorted-asc', h.dataset.key === sort.key && sort.dir > 0));
    heads.forEach((h) => h.classList.toggle('sorted-desc', h.dataset.key === sort.key && sort.dir < 0));
    tbody.replaceChildren(...rows.map((r) => el('tr', {}, COLUMNS.map((c) =>
      el('td', { class: c.ms || c.num ? 'num' : '' }, c.ms ? meanStd(r[c.key], c.digits) : c.text(r))))));
  }
  draw();
  view.replaceChildren(
    el('h1', {}, `Compare: ${name}`),
    el('p', { class: 'muted' }, 'Means ± sample std over the SUCCEEDED seeds of each variant; diverged runs are counted, not averaged. Click a header to sort.'),
    el('table', { id: 'compare' }, el('thead', {}, el('tr', {}, heads)), tbody));
}

// #/compare/NAME : the `ablate table` comparison, sortable, mean ± std over seeds; when the runs
// measured validation loss at several lengths (train.eval_seq_lens), PPL against length per
// variant, as a chart and a table.
import { api } from '../api.js';
import { lengthChart } from '../charts.js';
import { el, num, count, runColor } from '../format.js';

const COLUMNS = [
  { key: 'variant', label: 'variant', text: (r) => rowLabel(r) },
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

function rowLabel(r) {
  return r.variant + (r.axes ? ` (${r.axes})` : '');
}

// PPL against evaluation length: one line per row (variant, axis point) with a value, the std as
// error bars, the YaRN lengths marked; then the same numbers as a table.
function lengthsSection(rows) {
  const measured = rows.filter((r) => r.lengths.length > 0);
  const lengths = [...new Set(measured.flatMap((r) => r.lengths.map((l) => l.seq_len)))].sort((a, b) => a - b);
  const yarnLengths = new Set(measured.flatMap((r) => r.lengths.filter((l) => l.yarn).map((l) => l.seq_len)));
  const at = (r, len) => r.lengths.find((l) => l.seq_len === len);
  const series = measured.map((r, i) => ({
    label: rowLabel(r),
    stroke: runColor(i),
    mean: lengths.map((len) => at(r, len)?.val_ppl.mean ?? null),
    std: lengths.map((len) => at(r, len)?.val_ppl.std ?? null),
    yarn: lengths.map((len) => at(r, len)?.yarn ?? false),
  }));
  const chartBox = el('div', { class: 'chart', id: 'lengths-chart', 'data-series': series.length });
  let chart = null;
  const draw = (log) => {
    if (chart) chart.destroy();
    chart = lengthChart(chartBox, { title: 'Validation PPL against evaluation length', lengths, series,
      yLabel: 'val PPL', log, yarn: (len) => yarnLengths.has(len) });
  };
  const table = el('table', { id: 'lengths-table' },
    el('thead', {}, el('tr', {}, el('th', {}, 'variant'), lengths.map((len) =>
      el('th', { class: 'num' }, `PPL@${len}${yarnLengths.has(len) ? ' (YaRN)' : ''}`)))),
    el('tbody', {}, measured.map((r) => el('tr', {}, el('td', {}, rowLabel(r)), lengths.map((len) => {
      const l = at(r, len);
      return el('td', { class: 'num', title: l ? `n = ${l.n}, val loss ${meanStd(l.val_loss, 4)}` : null },
        l ? meanStd(l.val_ppl, 2) : '—');
    })))));
  const section = el('div', { id: 'lengths' },
    el('h2', {}, 'Evaluation lengths'),
    el('div', { class: 'controls' },
      el('label', {}, el('input', { type: 'checkbox', id: 'lengths-log', onchange: (e) => draw(e.target.checked) }), 'log scale'),
      el('span', { class: 'muted' }, 'Each variant\'s final validation PPL at each train.eval_seq_lens length, mean ± sample std (error bars) over the SUCCEEDED seeds.'
        + (yarnLengths.size ? ' * measured with YaRN RoPE scaling.' : ''))),
    chartBox, table);
  return { section, draw: () => draw(false) };
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
  if (table.rows.some((r) => r.lengths.length > 0)) {
    const lengths = lengthsSection(table.rows);
    view.append(lengths.section);
    lengths.draw();  // once in the page: the chart takes its width from its box
  }
}

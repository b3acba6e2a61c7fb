// A sweep's comparison table and its figures, built from the comparison table
// (GET /api/sweeps/NAME/table) and the figures' numbers (GET /api/sweeps/NAME/figures,
// orchestrator/report/figures.h): what the compare page shows, and what `ablate report`'s
// index.html shows from its embedded copy of the same JSON (it inlines this module).
//
// Each section builder returns { section, draw }: append the section to the page, then draw()
// (a chart takes its width from its box). Colours are by table row, as the report's SVG figures.
import { bandChart, barChart, errorLineChart, lengthChart, meanBarChart } from './charts.js';
import { el, num, count, runColor } from './format.js';

const COLUMNS = [
  { key: 'variant', label: 'variant', text: (r) => rowLabel(r) },
  { key: 'n', label: 'n', num: true, value: (r) => r.n, text: (r) => `${r.n}/${r.runs}` },
  { key: 'val_loss', label: 'val loss', ms: true, digits: 4, interim: true },
  { key: 'val_ppl', label: 'val PPL', ms: true, digits: 2, interim: true },
  { key: 'gate_score', label: 'gate score', ms: true, digits: 3, interim: true },
  { key: 'm_act', label: 'M-Act', ms: true, digits: 1, interim: true },
  { key: 'f_attn', label: 'F-Attn', ms: true, digits: 3, interim: true },
  { key: 'spike_score', label: 'spike score', ms: true, digits: 4 },
  { key: 'params_total', label: 'params', num: true, value: (r) => r.params_total, text: (r) => count(r.params_total) },
  { key: 'params_added', label: 'added', num: true, value: (r) => r.params_added, text: (r) => count(r.params_added, true) },
  { key: 'diverged', label: 'diverged', num: true, value: (r) => r.diverged, text: (r) => r.diverged },
  { key: 'failed', label: 'failed', num: true, value: (r) => r.failed, text: (r) => r.failed },
];

export function meanStd(m, digits) {
  if (!m || m.mean === null || m.mean === undefined) return '—';
  if (m.std === null || m.std === undefined) return num(m.mean, digits);
  // A spread below the shown precision (float noise over identical values) reads as 0.
  const std = Math.abs(m.std) < 0.5 * 10 ** -digits ? 0 : m.std;
  return `${num(m.mean, digits)} ± ${num(std, digits)}`;
}

export function rowLabel(r) {
  return r.variant + (r.axes ? ` (${r.axes})` : '');
}

function groupKey(r) {
  return `${r.variant}\u0000${r.axes}`;
}

function stepsText(g) {
  return g.eval_step_min === g.eval_step_max ? `step ${g.eval_step_max}` : `steps ${g.eval_step_min}–${g.eval_step_max}`;
}

// The comparison table, sortable by a click on a header. A row none of whose runs has finished
// shows, in place of dashes, the latest evaluation of its runs still training, marked interim.
// Returns { node, update(table, figures) } (update keeps the sort).
export function comparisonTable(table, figures) {
  let sort = { key: 'val_loss', dir: 1 };
  let rows = table.rows;
  let interimOf = new Map();
  const tbody = el('tbody');
  const note = el('p', { class: 'muted interim-note', id: 'interim-note' });
  const heads = COLUMNS.map((c) => el('th', {
    class: `sortable ${c.ms || c.num ? 'num' : ''}`, 'data-key': c.key,
    onclick: () => { sort = { key: c.key, dir: sort.key === c.key ? -sort.dir : 1 }; draw(); },
  }, c.label));
  const shown = (c, r) => {
    const g = interimOf.get(groupKey(r));
    return c.interim && g ? g[c.key] : r[c.key];
  };
  const sortValue = (c, r) => (c.ms ? shown(c, r).mean : c.value ? c.value(r) : c.text(r));
  function cell(c, r) {
    const g = interimOf.get(groupKey(r));
    if (c.ms && c.interim && g) {
      return el('td', { class: 'num interim', title: `interim: the latest evaluation of ${g.eval_runs} run${g.eval_runs === 1 ? '' : 's'} still training (${stepsText(g)}), not a final result` },
        meanStd(g[c.key], c.digits), ' ', el('span', { class: 'interim-tag' }, `interim @ ${g.eval_step_max}`));
    }
    return el('td', { class: c.ms || c.num ? 'num' : '' }, c.ms ? meanStd(r[c.key], c.digits) : c.text(r));
  }
  function draw() {
    const col = COLUMNS.find((c) => c.key === sort.key);
    const sorted = [...rows].sort((a, b) => {
      const x = sortValue(col, a), y = sortValue(col, b);
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * sort.dir;
    });
    heads.forEach((h) => h.classList.toggle('sorted-asc', h.dataset.key === sort.key && sort.dir > 0));
    heads.forEach((h) => h.classList.toggle('sorted-desc', h.dataset.key === sort.key && sort.dir < 0));
    tbody.replaceChildren(...sorted.map((r) => el('tr', { class: interimOf.has(groupKey(r)) ? 'interim-row' : null },
      COLUMNS.map((c) => cell(c, r)))));
    note.textContent = interimOf.size > 0
      ? `Interim: ${interimOf.size} variant${interimOf.size === 1 ? ' has' : 's have'} no finished run yet; their cells show the latest evaluation of their runs still training (marked interim), not results.`
      : '';
  }
  function update(newTable, newFigures) {
    rows = newTable.rows;
    interimOf = new Map((newFigures?.groups || []).filter((g) => g.interim && g.n === 0).map((g) => [groupKey(g), g]));
    draw();
  }
  update(table, figures);
  return { node: el('div', {}, el('table', { id: 'compare' }, el('thead', {}, el('tr', {}, heads)), tbody), note), update };
}

function section(id, title, intro, ...children) {
  return el('div', { id, class: 'figure-section' }, el('h2', {}, title), intro ? el('p', { class: 'muted' }, intro) : null, ...children);
}

// Training loss: each row's mean over its runs that did not diverge, fail or get cancelled, ± std
// as a band; diverged runs dashed; spike events as red triangles.
export function lossSection(figures) {
  const box = el('div', { class: 'chart', id: 'loss-chart' });
  const bands = figures.groups.map((g, i) => ({ label: `${g.label} (${g.band_runs} run${g.band_runs === 1 ? '' : 's'})`, stroke: runColor(i),
    mean: g.loss.mean, std: g.loss.std }));
  const lines = figures.groups.flatMap((g, i) => g.diverged_curves.map((c) => ({ label: `${g.label} seed ${c.seed} (diverged)`, stroke: runColor(i),
    step: c.step, value: c.loss, seconds: c.seconds || [] })));
  const lineIndex = new Map();
  let next = bands.length + 1;
  figures.groups.forEach((g) => g.diverged_curves.forEach((c) => lineIndex.set(c.run, next++)));
  const spikes = figures.groups.flatMap((g, i) => g.spikes.map((s) => ({ seriesIdx: lineIndex.get(s.run) ?? i + 1, step: s.step, value: s.loss, seconds: s.seconds })));
  box.dataset.series = bands.length + lines.length;
  box.dataset.spikes = spikes.length;
  const log = el('input', { type: 'checkbox', id: 'loss-log', checked: true });
  // Against steps, or tokens seen / FLOPs spent: each variant's steps times its own per-step cost
  // (variants of one budget differ in FLOPs per token), when every variant has it; or against
  // training time: each step at its runs' mean training seconds (variants differ in speed), when
  // every variant with a band has them.
  const scalable = (key) => figures.groups.every((g) => Number.isFinite(g[key]));
  const timed = (g) => (g.loss.seconds || []).some(Number.isFinite);
  const hasTime = figures.groups.some(timed) && figures.groups.every((g) => timed(g) || !g.loss.mean.some(Number.isFinite));
  const against = el('select', { id: 'loss-x' },
    [['step', 'step', true], ['tokens', 'tokens seen', scalable('tokens_per_step')], ['flops', 'FLOPs spent', scalable('flops_per_step')],
      ['time', 'training seconds', hasTime]]
      .map(([value, label, ok]) => el('option', { value, disabled: !ok }, label)));
  let chart = null;
  // The points of xs (and of each array in `alongs`) whose x is finite.
  const finite = (xs, ...alongs) => {
    const keep = xs.map((v, k) => k).filter((k) => Number.isFinite(xs[k]));
    return [keep.map((k) => xs[k]), ...alongs.map((a) => keep.map((k) => a[k]))];
  };
  const draw = () => {
    const x = against.value;
    const per = (i) => (x === 'step' ? 1 : figures.groups[i][x === 'tokens' ? 'tokens_per_step' : 'flops_per_step']);
    const groupOfLine = figures.groups.flatMap((g, i) => g.diverged_curves.map(() => i));
    const groupOfSeries = [null, ...figures.groups.map((_, i) => i), ...groupOfLine];
    const onX = x === 'time'
      ? { bands: bands.map((b, i) => {
        const [xs, mean, std] = finite(figures.groups[i].loss.seconds || [], b.mean, b.std);
        return { ...b, steps: xs, mean, std };
      }),
      lines: lines.map((l) => {
        const [xs, value] = finite(l.seconds, l.value);
        return { ...l, step: xs, value };
      }),
      spikes: spikes.filter((s) => Number.isFinite(s.seconds)).map((s) => ({ ...s, step: s.seconds })) }
      : { bands: bands.map((b, i) => ({ ...b, steps: figures.steps.map((s) => s * per(i)) })),
        lines: lines.map((l, k) => ({ ...l, step: l.step.map((s) => s * per(groupOfLine[k])) })),
        spikes: spikes.map((s) => ({ ...s, step: s.step * per(groupOfSeries[s.seriesIdx]) })) };
    if (chart) chart.destroy();
    chart = bandChart(box, { title: 'Training loss: mean ± std over seeds', steps: figures.steps, ...onX,
      log: log.checked, yLabel: 'training loss', xLabel: against.selectedOptions[0].textContent });
    box.dataset.x = x;
  };
  log.addEventListener('change', draw);
  against.addEventListener('change', draw);
  const stride = figures.stride === 1 ? 'every step' : `every ${figures.stride}th step`;
  return { section: section('loss', 'Training loss',
    `Each variant's mean loss over its runs that did not diverge, fail or get cancelled (${stride}), ± the sample std as a band; diverged runs dashed; red triangles: spike events.`,
    el('div', { class: 'controls' }, el('label', {}, log, 'log scale'), el('label', {}, 'against', against)), box), draw };
}

// Validation loss bars with error bars: the table's mean ± std over SUCCEEDED seeds, or interim.
export function valLossSection(figures) {
  const shown = figures.groups.filter((g) => g.val_loss.mean !== null);
  const box = el('div', { class: 'chart', id: 'val-loss-chart', 'data-bars': shown.length,
    'data-interim': shown.filter((g) => g.interim).length });
  const draw = () => meanBarChart(box, { title: 'Validation loss: mean ± std over seeds', labels: shown.map((g) => g.label + (g.interim ? ' (interim)' : '')),
    mean: shown.map((g) => g.val_loss.mean), std: shown.map((g) => g.val_loss.std), interim: shown.map((g) => g.interim), yLabel: 'val loss' });
  return { section: section('val-loss', 'Validation loss',
    'Final validation loss per variant, mean ± sample std (error bars) over its SUCCEEDED seeds; interim bars (orange): the latest evaluation of runs still training. The axis does not start at 0.', box), draw };
}

// M-Act and F-Attn per layer at each run's last evaluation, mean ± std over seeds.
export function layersSection(figures) {
  const withLayers = figures.groups.map((g, i) => ({ g, i })).filter(({ g }) => g.layers.length > 0);
  const layers = [...new Set(withLayers.flatMap(({ g }) => g.layers.map((l) => l.layer)))].sort((a, b) => a - b);
  const boxes = ['m_act', 'f_attn'].map((key) => el('div', { class: 'chart', id: `layers-${key.replace('_', '-')}`, 'data-series': withLayers.length }));
  const series = (key) => withLayers.map(({ g, i }) => {
    const at = new Map(g.layers.map((l) => [l.layer, l[key]]));
    return { label: g.label + (g.interim ? ' (interim)' : ''), stroke: runColor(i), dash: g.interim,
      mean: layers.map((l) => at.get(l)?.mean ?? null), std: layers.map((l) => at.get(l)?.std ?? null) };
  });
  const draw = () => {
    errorLineChart(boxes[0], { title: 'M-Act per layer: max |hidden state|', xs: layers, series: series('m_act'), xLabel: 'layer', yLabel: 'M-Act (log)', log: true });
    errorLineChart(boxes[1], { title: 'F-Attn per layer: attention on the first token', xs: layers, series: series('f_attn'), xLabel: 'layer', yLabel: 'F-Attn' });
  };
  return { section: section('layers', 'M-Act and F-Attn per layer',
    'At each run\'s last evaluation, mean ± sample std over the SUCCEEDED seeds (dashed: interim, runs still training).',
    el('div', { class: 'grid' }, boxes)), draw };
}

// Gate-score histograms, one per gated variant, summed over layers and seeds, in % of its scores.
export function gateSection(figures) {
  const gated = figures.groups.map((g, i) => ({ g, i })).filter(({ g }) => g.gate_histogram);
  const pct = ({ g }) => {
    const total = g.gate_histogram.counts.reduce((a, b) => a + b, 0);
    return g.gate_histogram.counts.map((c) => (total > 0 ? (100 * c) / total : 0));
  };
  const top = Math.max(0, ...gated.flatMap(pct));
  const boxes = gated.map(() => el('div', { class: 'chart gate-histogram' }));
  const draw = () => gated.forEach((item, k) => {
    const h = item.g.gate_histogram;
    const w = (h.hi - h.lo) / Math.max(1, h.counts.length);
    barChart(boxes[k], { title: `${item.g.label}${item.g.interim ? ' (interim)' : ''}: ${item.g.eval_runs} run${item.g.eval_runs === 1 ? '' : 's'}, ${stepsText(item.g)}`,
      labels: h.counts.map((_, b) => (h.lo + w * (b + 0.5)).toFixed(2)), values: pct(item), xLabel: 'gate score', yLabel: '% of scores',
      color: runColor(item.i), yMax: top > 0 ? top * 1.08 : 1 });
  });
  return { section: section('gates', 'Gate scores',
    gated.length ? 'The gate scores of every gated layer at each run\'s last evaluation, summed over layers and seeds, in % of the variant\'s scores (one y scale for all).'
      : 'No variant has a gate.',
    el('div', { class: 'grid', id: 'gate-histograms', 'data-count': gated.length }, boxes)), draw };
}

// PPL against evaluation length: one line per row (variant, axis point) with a value, the std as
// error bars, the YaRN lengths marked; then the same numbers as a table.
export function lengthsSection(rows) {
  const measured = rows.map((r, i) => ({ r, i })).filter(({ r }) => r.lengths.length > 0);
  const lengths = [...new Set(measured.flatMap(({ r }) => r.lengths.map((l) => l.seq_len)))].sort((a, b) => a - b);
  const yarnLengths = new Set(measured.flatMap(({ r }) => r.lengths.filter((l) => l.yarn).map((l) => l.seq_len)));
  const at = (r, len) => r.lengths.find((l) => l.seq_len === len);
  const series = measured.map(({ r, i }) => ({
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
    el('tbody', {}, measured.map(({ r }) => el('tr', {}, el('td', {}, rowLabel(r)), lengths.map((len) => {
      const l = at(r, len);
      return el('td', { class: 'num', title: l ? `n = ${l.n}, val loss ${meanStd(l.val_loss, 4)}` : null },
        l ? meanStd(l.val_ppl, 2) : '—');
    })))));
  const node = el('div', { id: 'lengths', class: 'figure-section' },
    el('h2', {}, 'Evaluation lengths'),
    el('div', { class: 'controls' },
      el('label', {}, el('input', { type: 'checkbox', id: 'lengths-log', onchange: (e) => draw(e.target.checked) }), 'log scale'),
      el('span', { class: 'muted' }, 'Each variant\'s final validation PPL at each train.eval_seq_lens length, mean ± sample std (error bars) over the SUCCEEDED seeds.'
        + (yarnLengths.size ? ' * measured with YaRN RoPE scaling.' : ''))),
    chartBox, table);
  return { section: node, draw: () => draw(false) };
}

// Every figure section with something to show, in the report's order.
export function figureSections(table, figures) {
  const out = [];
  if (figures.steps.length > 0) out.push(lossSection(figures));
  if (figures.groups.some((g) => g.val_loss.mean !== null)) out.push(valLossSection(figures));
  if (figures.groups.some((g) => g.layers.length > 0)) out.push(layersSection(figures));
  if (figures.groups.some((g) => g.eval_runs > 0)) out.push(gateSection(figures));
  if (table.rows.some((r) => r.lengths.length > 0)) out.push(lengthsSection(table.rows));
  return out;
}

// The paired comparison against the reference (GET /api/compare/SWEEP..., `ablate compare --format
// json`): a forest plot of each variant's difference with its interval around zero, and the
// table. null when there is none (no reference among the runs).
const SVG_NS = 'http://www.w3.org/2000/svg';
function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function forestPlot(cmp) {
  const rows = cmp.rows.filter((r) => r.ci_low !== null && r.ci_high !== null);
  if (rows.length === 0) return el('p', { class: 'muted' }, 'No variant has an interval yet (two seeds per side are needed).');
  // Labels ("variant axis=value") get the room they need, up to half the width.
  const longest = Math.max(...rows.map((r) => (r.axes ? `${r.variant} ${r.axes}` : r.variant).length));
  const left = Math.min(Math.max(170, 7 * longest + 16), 420), width = left + 470;
  const rowH = 26, right = 30, top = 10;
  const height = top + rowH * rows.length + 30;
  let lo = Math.min(0, ...rows.map((r) => r.ci_low)), hi = Math.max(0, ...rows.map((r) => r.ci_high));
  const pad = (hi - lo) * 0.08 || 1e-3;
  lo -= pad; hi += pad;
  const x = (v) => left + ((v - lo) / (hi - lo)) * (width - left - right);
  const svg = svgEl('svg', { width, height, viewBox: `0 0 ${width} ${height}`, id: 'forest', role: 'img' });
  svg.append(svgEl('line', { x1: x(0), x2: x(0), y1: top - 4, y2: height - 26, stroke: '#6b7280', 'stroke-dasharray': '4 3' }));
  const decided = new Set(['better', 'worse', 'lower', 'higher']);
  rows.forEach((r, i) => {
    const y = top + rowH * i + rowH / 2;
    const color = decided.has(r.verdict) ? '#1d2330' : '#9aa3b2';  // the point: a verdict, or none
    svg.append(svgEl('text', { x: left - 8, y: y + 4, 'text-anchor': 'end', 'font-size': 12 }, r.axes ? `${r.variant} ${r.axes}` : r.variant));
    svg.append(svgEl('line', { x1: x(r.ci_low), x2: x(r.ci_high), y1: y, y2: y, stroke: '#2f6fde', 'stroke-width': 2 }));
    svg.append(svgEl('circle', { cx: x(r.delta), cy: y, r: 4, fill: color, 'data-variant': r.variant }));
  });
  for (const v of [lo + pad, 0, hi - pad]) {
    svg.append(svgEl('text', { x: x(v), y: height - 8, 'text-anchor': 'middle', 'font-size': 11 }, num(v, 4)));
  }
  return svg;
}

export function pairedSection(cmp) {
  if (!cmp) return null;
  const level = Math.round(100 * (1 - cmp.alpha));
  const p = (v) => (v === null ? '—' : v === 0 ? '0' : v < 1e-4 ? v.toExponential(1) : Number(v.toPrecision(3)).toString());
  const heads = ['variant', 'pairs', cmp.reference, 'mean', 'Δ', `${level}% CI`, 'p', cmp.correction === 'holm' ? 'p (Holm)' : 'p', 'verdict', 'detectable'];
  const table = el('table', { id: 'paired' },
    el('thead', {}, el('tr', {}, heads.map((h, i) => el('th', { class: i > 0 && i !== 8 ? 'num' : '' }, h)))),
    el('tbody', {}, cmp.rows.map((r) => el('tr', { class: `verdict-${r.verdict.replace(/ /g, '-')}` },
      el('td', {}, r.axes ? `${r.variant} (${r.axes})` : r.variant),
      el('td', { class: 'num' }, r.test === 'Welch' ? `${r.n_pairs} (Welch)` : r.n_pairs),
      el('td', { class: 'num' }, num(r.reference_mean)), el('td', { class: 'num' }, num(r.variant_mean)),
      el('td', { class: 'num' }, num(r.delta)),
      el('td', { class: 'num' }, r.ci_low === null ? '—' : `[${num(r.ci_low)}, ${num(r.ci_high)}]`),
      el('td', { class: 'num' }, p(r.p_value)), el('td', { class: 'num' }, p(r.p_adjusted)),
      el('td', { class: 'verdict', title: r.note || '' }, r.note ? `${r.verdict} (${r.note})` : r.verdict),
      el('td', { class: 'num' }, num(r.min_detectable))))));
  const chance = cmp.chance === null || cmp.chance === undefined ? '' : ` Chance level: ${num(cmp.chance)}.`;
  const intro = `${cmp.heading} of each variant against ${cmp.reference}, paired by seed (${cmp.lower_is_better ? 'lower is better' : cmp.higher_is_better ? 'higher is better' : 'no better direction'}). ${level}% intervals of the difference; verdicts from the ${cmp.correction === 'holm' ? 'Holm-adjusted' : 'unadjusted'} p-values at alpha ${cmp.alpha}. "detectable": the smallest difference these seeds could tell from none with 80% power.${chance}`;
  return { section: section('paired-section', `Against ${cmp.reference}`, intro, forestPlot(cmp), table, ...itemsTable(cmp, p)), draw: () => {} };
}

// The test over items of an evaluation task's accuracy (`ablate compare`'s second table): each
// item scored by both runs of a seed, pooled over the paired seeds. Nothing when no row has items.
function itemsTable(cmp, p) {
  const rows = cmp.rows.filter((r) => r.items);
  if (rows.length === 0) return [];
  const level = Math.round(100 * (1 - cmp.alpha));
  const withInterval = (mean, [lo, hi]) => (lo === null ? num(mean) : `${num(mean)} [${num(lo)}, ${num(hi)}]`);
  const heads = ['variant', 'items', 'chance', cmp.reference, 'mean', 'Δ', `${level}% CI`, 'test', 'p', cmp.correction === 'holm' ? 'p (Holm)' : 'p', 'verdict'];
  return [el('p', { class: 'muted' }, `Over items: each item scored by both runs of a seed, pooled over the paired seeds; McNemar's exact test where every score is 0 or 1 (with ${level}% Wilson intervals), else a paired bootstrap.`),
    el('table', { id: 'paired-items' },
      el('thead', {}, el('tr', {}, heads.map((h, i) => el('th', { class: i > 0 && i < 7 || i === 8 || i === 9 ? 'num' : '' }, h)))),
      el('tbody', {}, rows.map((r) => el('tr', { class: `verdict-${r.items.verdict.replace(/ /g, '-')}` },
        el('td', {}, r.axes ? `${r.variant} (${r.axes})` : r.variant),
        el('td', { class: 'num' }, `${r.items.n} (${r.items.seeds} seeds)`),
        el('td', { class: 'num' }, cmp.chance === null ? '—' : num(cmp.chance)),
        el('td', { class: 'num' }, withInterval(r.items.reference_mean, r.items.reference_interval)),
        el('td', { class: 'num' }, withInterval(r.items.variant_mean, r.items.variant_interval)),
        el('td', { class: 'num' }, num(r.items.delta)),
        el('td', { class: 'num' }, r.items.ci_low === null ? '—' : `[${num(r.items.ci_low)}, ${num(r.items.ci_high)}]`),
        el('td', {}, r.items.test),
        el('td', { class: 'num' }, p(r.items.p_value)), el('td', { class: 'num' }, p(r.items.p_adjusted)),
        el('td', { class: 'verdict' }, r.items.verdict)))))];
}

// A tuned sweep (GET /api/sweeps/NAME/tune, `tune:` in its spec): each variant's metric against
// the tuned value, as figures/tune.svg of `ablate report` draws it. The mean over the runs that
// trained to the end (line and dots), runs a tuner STOPPED at a rung with their metric there
// (rings), values where a run DIVERGED (triangles on the top edge) and a boundary sweep's
// brackets (dashed verticals at the largest stable and the smallest unstable value); then the
// stability table (`ablate table --stability`). null for a sweep without `tune:`.
const tuneText = (v) => (v === null || v === undefined ? '—' : Number(v.toPrecision(3)).toString());

function tuneChart(t) {
  const { axis, metric, log_scale: log } = t.tune;
  const width = 760, height = 380, left = 64, right = 24, top = 18, bottom = 52;
  const xs = t.curves.flatMap((c) => [...c.points.map((p) => p.value),
    ...(c.bracket ? [c.bracket.stable, c.bracket.unstable] : [])]).filter((v) => v !== null);
  const ys = t.curves.flatMap((c) => c.points.flatMap((p) => [p.mean, ...p.stopped.map((s) => s.metric)]))
    .filter((v) => v !== null && Number.isFinite(v));
  const tx = (v) => (log ? Math.log10(v) : v);
  let x0 = Math.min(...xs.map(tx)), x1 = Math.max(...xs.map(tx));
  if (!(x1 > x0)) { x0 -= 0.5; x1 += 0.5; }
  const xPad = (x1 - x0) * 0.05;
  x0 -= xPad; x1 += xPad;
  let y0 = ys.length ? Math.min(...ys) : 0, y1 = ys.length ? Math.max(...ys) : 1;
  if (!(y1 > y0)) { y0 -= 0.5; y1 += 0.5; }
  const yPad = (y1 - y0) * 0.08;
  y0 -= yPad; y1 += yPad;
  const px = (v) => left + ((tx(v) - x0) / (x1 - x0)) * (width - left - right);
  const py = (v) => top + (1 - (v - y0) / (y1 - y0)) * (height - top - bottom);
  const svg = svgEl('svg', { width, height, viewBox: `0 0 ${width} ${height}`, id: 'tune-svg', role: 'img' });
  svg.append(svgEl('rect', { x: left, y: top, width: width - left - right, height: height - top - bottom, fill: 'none', stroke: '#c8ced8' }));
  // Ticks: the values tried (at most 9 of them, evenly thinned), and 5 on the metric.
  const values = [...new Set(xs)].sort((a, b) => a - b);
  const every = Math.ceil(values.length / 9);
  values.filter((_, i) => i % every === 0).forEach((v) => {
    svg.append(svgEl('line', { x1: px(v), x2: px(v), y1: height - bottom, y2: height - bottom + 4, stroke: '#6b7280' }));
    svg.append(svgEl('text', { x: px(v), y: height - bottom + 16, 'text-anchor': 'middle', 'font-size': 11 }, tuneText(v)));
  });
  for (let k = 0; k <= 4; k++) {
    const v = y0 + yPad + ((y1 - y0 - 2 * yPad) * k) / 4;
    svg.append(svgEl('text', { x: left - 6, y: py(v) + 4, 'text-anchor': 'end', 'font-size': 11 }, num(v, 3)));
  }
  svg.append(svgEl('text', { x: (left + width - right) / 2, y: height - 12, 'text-anchor': 'middle', 'font-size': 12 }, `${axis}${log ? ' (log scale)' : ''}`));
  svg.append(svgEl('text', { x: 14, y: (top + height - bottom) / 2, 'text-anchor': 'middle', 'font-size': 12,
    transform: `rotate(-90 14 ${(top + height - bottom) / 2})` }, metric));
  t.curves.forEach((c, i) => {
    const color = runColor(i);
    const label = c.axes ? `${c.variant} (${c.axes})` : c.variant;
    const done = c.points.filter((p) => p.mean !== null);
    if (done.length > 1) {
      svg.append(svgEl('polyline', { class: 'tune-line', 'data-variant': c.variant, fill: 'none', stroke: color, 'stroke-width': 2,
        points: done.map((p) => `${px(p.value)},${py(p.mean)}`).join(' ') }));
    }
    for (const p of c.points) {
      if (p.mean !== null) {
        const dot = svgEl('circle', { class: 'tune-point', 'data-variant': c.variant, cx: px(p.value), cy: py(p.mean), r: 4, fill: color });
        dot.append(svgEl('title', {}, `${label} at ${tuneText(p.value)}: ${metric} ${num(p.mean)} (mean of ${p.finished} of ${p.runs})`));
        svg.append(dot);
      }
      for (const s of p.stopped.filter((st) => st.metric !== null)) {
        const ring = svgEl('circle', { class: 'tune-stopped', 'data-variant': c.variant, cx: px(p.value), cy: py(s.metric), r: 5, fill: 'none', stroke: color, 'stroke-width': 1.6 });
        ring.append(svgEl('title', {}, `${label} at ${tuneText(p.value)}: run ${s.run} stopped at step ${s.step}, ${metric} ${num(s.metric)}`));
        svg.append(ring);
      }
      if (p.diverged > 0) {
        const x = px(p.value), y = top + 2;
        const tri = svgEl('polygon', { class: 'tune-diverged', 'data-variant': c.variant, fill: color, points: `${x - 5},${y} ${x + 5},${y} ${x},${y + 9}` });
        tri.append(svgEl('title', {}, `${label} at ${tuneText(p.value)}: ${p.diverged} of ${p.runs} run${p.runs === 1 ? '' : 's'} diverged`));
        svg.append(tri);
      }
    }
    for (const v of c.bracket ? [c.bracket.stable, c.bracket.unstable] : []) {
      if (v === null) continue;
      svg.append(svgEl('line', { class: 'tune-bracket', 'data-variant': c.variant, x1: px(v), x2: px(v), y1: top, y2: height - bottom,
        stroke: color, 'stroke-dasharray': '5 4', 'stroke-width': 1.2 }));
    }
  });
  const legend = el('div', { class: 'tune-legend' }, t.curves.map((c, i) => el('span', { class: 'tune-key' },
    el('span', { class: 'swatch', style: `background:${runColor(i)}` }), c.axes ? `${c.variant} (${c.axes})` : c.variant)));
  return el('div', { class: 'tune-chart', id: 'tune-chart' }, svg, legend);
}

function stabilityTable(curves) {
  const rows = curves.filter((c) => c.bracket);
  const axes = rows.some((c) => c.axes);
  const heads = ['variant', ...(axes ? ['axes'] : []), 'stable', 'unstable', 'probes', 'found'];
  return el('table', { id: 'stability' },
    el('thead', {}, el('tr', {}, heads.map((h) => el('th', { class: ['stable', 'unstable', 'probes'].includes(h) ? 'num' : '' }, h)))),
    el('tbody', {}, rows.map((c) => el('tr', { class: `bracket-${c.bracket.state}` },
      el('td', {}, c.variant), axes ? el('td', {}, c.axes) : null,
      el('td', { class: 'num' }, tuneText(c.bracket.stable)), el('td', { class: 'num' }, tuneText(c.bracket.unstable)),
      el('td', { class: 'num' }, c.bracket.probes), el('td', {}, c.bracket.found)))));
}

export function tuneSection(t) {
  if (!t || !t.tune || t.curves.length === 0) return null;
  const { axis, method, metric } = t.tune;
  const boundary = t.curves.some((c) => c.bracket);
  const intro = `Each variant's ${metric} against ${axis} (${method}): the mean over the seeds that trained to the end (line and dots), runs the tuner stopped at a rung with their ${metric} there (rings), and values where a run diverged (triangles on the top edge)${boundary ? '; dashed: each variant\'s stability bracket, its largest stable and smallest unstable value.' : '.'}`;
  const parts = [tuneChart(t)];
  if (boundary) parts.push(el('h3', {}, `Stability boundary of ${axis}`), stabilityTable(t.curves));
  return { section: section('tune-section', `${metric} against ${axis}`, intro, ...parts), draw: () => {} };
}

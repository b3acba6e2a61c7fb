// Parallel coordinates of a study's runs, drawn on a canvas: one vertical axis per swept value
// (the runs' `axes`, path=value), one for the variant, one per final metric; one line per
// finished run in its variant's colour. Dragging along an axis brushes a range of it (several
// axes: a run must be inside every brush); a click on an axis clears its brush. `onSelect` gets
// the runs inside the brushes after each change, for the table that follows the chart.
import { el, num, runColor } from './format.js';

const METRICS = [['val_loss', 'val loss'], ['m_act', 'M-Act'], ['f_attn', 'F-Attn'],
  ['spike_score', 'spike score'], ['gate_score', 'gate score'], ['final_train_loss', 'train loss']];
const HEIGHT = 340;
const MARGIN = { top: 34, bottom: 28, side: 48 };
const UNSELECTED = 'rgba(160, 160, 160, 0.35)';

// "train.optimizer.lr=0.02 model.num_layers=8" -> {train.optimizer.lr: "0.02", ...}
export function parseAxes(text) {
  const out = {};
  for (const part of (text || '').split(' ')) {
    const at = part.indexOf('=');
    if (at > 0) out[part.slice(0, at)] = part.slice(at + 1);
  }
  return out;
}

// The axes a set of runs spans: categorical (variant, non-numeric values) or numeric (log when
// positive over a decade or more). Axes with a single value are left out but for the variant.
export function axesOf(runs) {
  const axes = [];
  const variants = [...new Set(runs.map((r) => r.variant))];
  axes.push({ key: 'variant', label: 'variant', categories: variants, value: (r) => r.variant });
  const paths = [...new Set(runs.flatMap((r) => Object.keys(parseAxes(r.axes))))].sort();
  for (const p of paths) {
    const value = (r) => parseAxes(r.axes)[p];
    const values = [...new Set(runs.map(value).filter((v) => v !== undefined))];
    if (values.length < 2) continue;
    const numeric = values.every((v) => Number.isFinite(Number(v)));
    const label = p.split('.').pop();
    if (numeric) axes.push(numericAxis(p, label, (r) => (value(r) === undefined ? null : Number(value(r))), runs));
    else axes.push({ key: p, label, categories: values.sort(), value });
  }
  for (const [key, label] of METRICS) {
    const value = (r) => (Number.isFinite(r[key]) ? r[key] : null);
    if (new Set(runs.map(value).filter((v) => v !== null)).size >= 2) axes.push(numericAxis(key, label, value, runs));
  }
  return axes;
}

function numericAxis(key, label, value, runs) {
  const vs = runs.map(value).filter((v) => v !== null);
  let lo = Math.min(...vs), hi = Math.max(...vs);
  const log = lo > 0 && hi / lo >= 10;
  if (lo === hi) { lo -= Math.abs(lo) * 0.05 || 1; hi += Math.abs(hi) * 0.05 || 1; }
  return { key, label, lo, hi, log, value };
}

// Where `axis` puts run `r`, from 0 (bottom) to 1 (top); null when it has no value there.
function position(axis, r) {
  const v = axis.value(r);
  if (v === null || v === undefined) return null;
  if (axis.categories) {
    const i = axis.categories.indexOf(v);
    return axis.categories.length === 1 ? 0.5 : i / (axis.categories.length - 1);
  }
  if (axis.log) return (Math.log(v) - Math.log(axis.lo)) / (Math.log(axis.hi) - Math.log(axis.lo));
  return (v - axis.lo) / (axis.hi - axis.lo);
}

export function parallelCoordinates({ onSelect = () => {} } = {}) {
  const canvas = el('canvas', { height: HEIGHT, 'aria-label': 'parallel coordinates of the runs: drag along an axis to select a range' });
  const node = el('div', { class: 'chart', id: 'parcoords', 'data-selected': 0, 'data-total': 0 }, canvas);
  let runs = [], axes = [], colours = new Map();
  const brushes = new Map();  // axis key -> [lo, hi] in 0..1 (bottom to top)
  let drag = null;

  const width = () => Math.max(480, node.clientWidth || 900);
  const xOf = (i) => MARGIN.side + (i * (width() - 2 * MARGIN.side)) / Math.max(1, axes.length - 1);
  const yOf = (t) => MARGIN.top + (1 - t) * (HEIGHT - MARGIN.top - MARGIN.bottom);
  const tOf = (y) => 1 - (y - MARGIN.top) / (HEIGHT - MARGIN.top - MARGIN.bottom);

  function selected(r) {
    for (const a of axes) {
      const b = brushes.get(a.key);
      if (!b) continue;
      const t = position(a, r);
      if (t === null || t < b[0] - 1e-9 || t > b[1] + 1e-9) return false;
    }
    return true;
  }

  function line(ctx, r) {
    ctx.beginPath();
    let open = false;
    axes.forEach((a, i) => {
      const t = position(a, r);
      if (t === null) { open = false; return; }
      if (open) ctx.lineTo(xOf(i), yOf(t)); else ctx.moveTo(xOf(i), yOf(t));
      open = true;
    });
    ctx.stroke();
  }

  function draw() {
    const w = width();
    canvas.width = w;
    const ctx = canvas.getContext('2d');
    ctx.clearRect(0, 0, w, HEIGHT);
    const chosen = runs.filter(selected);
    ctx.lineWidth = 1.5;
    ctx.strokeStyle = UNSELECTED;
    for (const r of runs) if (!chosen.includes(r)) line(ctx, r);
    for (const r of chosen) { ctx.strokeStyle = colours.get(r.variant); line(ctx, r); }
    ctx.font = '12px sans-serif';
    ctx.textAlign = 'center';
    axes.forEach((a, i) => {
      const x = xOf(i);
      ctx.strokeStyle = '#333';
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(x, yOf(1));
      ctx.lineTo(x, yOf(0));
      ctx.stroke();
      ctx.fillStyle = '#222';
      ctx.fillText(a.label, x, 14);
      ctx.fillStyle = '#666';
      if (a.categories) {
        a.categories.forEach((c, j) => {
          const t = a.categories.length === 1 ? 0.5 : j / (a.categories.length - 1);
          ctx.textAlign = i === axes.length - 1 ? 'right' : 'left';
          ctx.fillText(String(c), x + (i === axes.length - 1 ? -4 : 4), yOf(t) + 4);
        });
        ctx.textAlign = 'center';
      } else {
        ctx.fillText(num(a.hi, 3), x, yOf(1) - 6);
        ctx.fillText(num(a.lo, 3), x, yOf(0) + 16);
      }
      const b = brushes.get(a.key);
      if (b) {
        ctx.fillStyle = 'rgba(47, 111, 222, 0.18)';
        ctx.strokeStyle = '#2f6fde';
        ctx.fillRect(x - 8, yOf(b[1]), 16, yOf(b[0]) - yOf(b[1]));
        ctx.strokeRect(x - 8, yOf(b[1]), 16, yOf(b[0]) - yOf(b[1]));
      }
    });
    node.dataset.selected = chosen.length;
    node.dataset.total = runs.length;
    // Where each axis is, in CSS pixels of the canvas: for tests and for anyone scripting it.
    node.dataset.axes = JSON.stringify(axes.map((a, i) => ({ key: a.key, x: xOf(i), top: yOf(1), bottom: yOf(0) })));
    return chosen;
  }

  function update() { onSelect(draw()); }

  function axisAt(x) {
    let best = -1, distance = 24;
    axes.forEach((a, i) => { const d = Math.abs(xOf(i) - x); if (d < distance) { distance = d; best = i; } });
    return best;
  }
  const local = (e) => { const rect = canvas.getBoundingClientRect(); return [e.clientX - rect.left, e.clientY - rect.top]; };
  canvas.addEventListener('mousedown', (e) => {
    const [x, y] = local(e);
    const i = axisAt(x);
    if (i < 0) return;
    drag = { key: axes[i].key, from: y, to: y };
    e.preventDefault();
  });
  canvas.addEventListener('mousemove', (e) => {
    if (!drag) return;
    drag.to = local(e)[1];
    const lo = Math.max(0, Math.min(1, tOf(Math.max(drag.from, drag.to))));
    const hi = Math.max(0, Math.min(1, tOf(Math.min(drag.from, drag.to))));
    if (Math.abs(drag.to - drag.from) >= 3) { brushes.set(drag.key, [lo, hi]); draw(); }
  });
  window.addEventListener('mouseup', () => {
    if (!drag) return;
    if (Math.abs(drag.to - drag.from) < 3) brushes.delete(drag.key);  // a click clears it
    drag = null;
    update();
  });

  return {
    node,
    // The runs to draw (finished ones: with a validation loss). Brushes on axes that remain stay.
    setRuns(all) {
      runs = all.filter((r) => Number.isFinite(r.val_loss));
      axes = axesOf(runs);
      colours = new Map(axes[0].categories.map((v, i) => [v, runColor(i)]));
      for (const k of [...brushes.keys()]) if (!axes.some((a) => a.key === k)) brushes.delete(k);
      update();
    },
    draw: update,
    colourOf: (variant) => colours.get(variant),
  };
}

// The table that follows the chart: the runs inside its brushes.
export function selectedRunsTable(runs, colourOf) {
  const metricKeys = METRICS.filter(([k]) => runs.some((r) => Number.isFinite(r[k])));
  return el('table', { id: 'parcoords-runs' },
    el('thead', {}, el('tr', {}, ['', 'run', 'sweep', 'variant', 'seed', 'axes', ...metricKeys.map(([, l]) => l)].map((h) => el('th', {}, h)))),
    el('tbody', {}, runs.map((r) => el('tr', { 'data-run': r.id },
      el('td', {}, el('span', { class: 'swatch', style: `background:${colourOf(r.variant)}` })),
      el('td', {}, el('a', { href: `#/run/${r.id}` }, `#${r.id}`)),
      el('td', {}, r.sweep),
      el('td', {}, r.variant),
      el('td', { class: 'num' }, r.seed),
      el('td', { class: 'muted' }, r.axes || '—'),
      metricKeys.map(([k]) => el('td', { class: 'num' }, num(r[k])))))));
}

// uPlot helpers: line charts over steps with spike markers, EMA smoothing, bar charts by layer, a
// metric against evaluation length with error bars, mean ± std bands over steps, bars with error
// bars, lines with error bars over layers; and attention-map heatmaps on a plain canvas, with their
// colour scale. The compare page and `ablate report`'s index.html (which inlines this file) draw
// with the same functions.
/* global uPlot */
import { el } from './format.js';

// Exponential moving average skipping gaps (null/NaN stay gaps). alpha = 0: the raw values.
export function ema(values, alpha) {
  if (!(alpha > 0)) return values;
  const out = new Array(values.length);
  let s = null;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || v === undefined || Number.isNaN(v)) { out[i] = null; continue; }
    s = s === null ? v : alpha * s + (1 - alpha) * v;
    out[i] = s;
  }
  return out;
}

// Aligns series with different step sets onto one x axis (the union of steps), nulls elsewhere.
export function joinSeries(list) {
  const all = new Set();
  for (const s of list) for (const x of s.step) all.add(x);
  const xs = Float64Array.from(all).sort();
  const index = new Map();
  for (let i = 0; i < xs.length; i++) index.set(xs[i], i);
  const data = [xs];
  for (const s of list) {
    const ys = new Array(xs.length).fill(null);
    for (let i = 0; i < s.step.length; i++) {
      const v = s.value[i];
      ys[index.get(s.step[i])] = v === null || Number.isNaN(v) ? null : v;
    }
    data.push(ys);
  }
  return data;
}

// Red triangles at spike steps: `spikes()` returns [{seriesIdx, step, value}].
function spikePlugin(spikes) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        ctx.fillStyle = '#d64541';
        ctx.strokeStyle = '#fff';
        const [ymin, ymax] = [u.scales.y.min, u.scales.y.max];
        for (const s of spikes()) {
          if (s.seriesIdx !== undefined && !u.series[s.seriesIdx]?.show) continue;
          const x = u.valToPos(s.step, 'x', true);
          let v = s.value;
          if (v === null || v === undefined || !Number.isFinite(v) || v > ymax) v = ymax;
          if (v < ymin) v = ymin;
          const y = u.valToPos(v, 'y', true);
          const r = 5 * devicePixelRatio;
          ctx.beginPath();
          ctx.moveTo(x, y - r);
          ctx.lineTo(x - r, y + r * 0.8);
          ctx.lineTo(x + r, y + r * 0.8);
          ctx.closePath();
          ctx.fill();
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

// A line chart. `series`: [{label, stroke, width}]; data as uPlot wants it ([xs, ys...]).
export function lineChart(target, { title, series, data, log = false, spikes = () => [],
  height = 320, yLabel = '', xLabel = 'step' }) {
  const width = Math.max(320, target.clientWidth - 14);
  const opts = {
    title,
    width,
    height,
    legend: { show: series.length <= 6 },
    cursor: { drag: { x: true, y: false } },
    scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
    axes: [{ label: xLabel }, { label: yLabel, size: 60 }],
    series: [{ label: xLabel }, ...series.map((s) => ({
      label: s.label, stroke: s.stroke, width: s.width || 1, spanGaps: true, points: { show: false },
    }))],
    plugins: [spikePlugin(spikes)],
  };
  return new uPlot(opts, data, target);
}

// Bars over layers (M-Act, F-Attn per layer) or histogram bins. `yMax`: a fixed top for the y axis
// (small multiples that share one scale).
export function barChart(target, { title, labels, values, xLabel, yLabel, color = '#2f6fde',
  height = 220, yMax = null, width: fixedWidth = null }) {
  const width = fixedWidth || Math.max(300, target.clientWidth - 14);
  const xs = labels.map((_, i) => i);
  const opts = {
    title,
    width,
    height,
    legend: { show: false },
    scales: {
      x: { time: false, range: [-0.5, Math.max(0.5, labels.length - 0.5)] },
      y: { range: (u, min, max) => [Math.min(0, min), yMax !== null ? yMax : max > 0 ? max * 1.08 : 1] },
    },
    axes: [
      { label: xLabel, values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? labels[t] ?? '' : '')) },
      { label: yLabel, size: 60 },
    ],
    series: [{}, {
      label: yLabel, fill: color, stroke: color, width: 0, points: { show: false },
      paths: uPlot.paths.bars({ size: [0.7, 60] }),
    }],
  };
  return new uPlot(opts, [xs, values], target);
}

// Vertical error bars (mean ± std) in each series' colour: `stds()[seriesIdx - 1][i]`, null for
// none.
function errorBarPlugin(stds) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        const [ymin, ymax] = [u.scales.y.min, u.scales.y.max];
        const cap = 4 * devicePixelRatio;
        ctx.save();
        ctx.lineWidth = 1.5 * devicePixelRatio;
        stds().forEach((std, s) => {
          const series = u.series[s + 1];
          if (!series.show) return;
          ctx.strokeStyle = series.stroke(u, s + 1);
          ctx.beginPath();
          for (let i = 0; i < u.data[0].length; i++) {
            const mean = u.data[s + 1][i];
            if (mean === null || mean === undefined || std[i] === null || std[i] === undefined || !(std[i] > 0)) continue;
            const x = u.valToPos(u.data[0][i], 'x', true);
            const lo = u.valToPos(Math.max(ymin, mean - std[i]), 'y', true);
            const hi = u.valToPos(Math.min(ymax, mean + std[i]), 'y', true);
            ctx.moveTo(x, lo);
            ctx.lineTo(x, hi);
            ctx.moveTo(x - cap, lo);
            ctx.lineTo(x + cap, lo);
            ctx.moveTo(x - cap, hi);
            ctx.lineTo(x + cap, hi);
          }
          ctx.stroke();
        });
        ctx.restore();
      }],
    },
  };
}

// A metric against evaluation length: x on a log2 scale with a tick at each length (`yarn(len)`
// true marks it with *), one line per series with mean ± std error bars. `series`:
// [{label, stroke, mean: [], std: [], yarn: []}], each array by `lengths`. The legend reads the
// hovered length's mean ± std and whether YaRN was on.
export function lengthChart(target, { title, lengths, series, yLabel, log = false, yarn = () => false,
  digits = 2, height = 340 }) {
  const width = Math.max(320, target.clientWidth - 14);
  // The y range holds the error bars too (uPlot's own fits the means only).
  let lo = Infinity, hi = -Infinity;
  for (const s of series) {
    s.mean.forEach((m, i) => {
      if (m === null || m === undefined || !Number.isFinite(m)) return;
      const d = Number.isFinite(s.std[i]) ? s.std[i] : 0;
      lo = Math.min(lo, log && m - d <= 0 ? m : m - d);
      hi = Math.max(hi, m + d);
    });
  }
  const yRange = (u, min, max) => {
    if (!(hi >= lo)) return [min, max];
    return log ? uPlot.rangeLog(lo, hi, 10, false) : uPlot.rangeNum(lo, hi, 0.1, true);
  };
  const fmt = (v) => (v === null || v === undefined || Number.isNaN(v) ? '—' : Number(v).toFixed(digits));
  const opts = {
    title,
    width,
    height,
    legend: { show: true },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: false, distr: 3, log: 2 }, y: log ? { distr: 3, range: yRange } : { range: yRange } },
    axes: [
      { label: 'evaluation length (tokens, log2 scale)', splits: () => lengths,
        values: (u, ticks) => ticks.map((t) => `${t}${yarn(t) ? '*' : ''}`) },
      { label: yLabel, size: 60 },
    ],
    series: [{ label: 'length', value: (u, v) => (v === null || v === undefined ? '—' : `${v}${yarn(v) ? ' (YaRN)' : ''}`) },
      ...series.map((s) => ({
        label: s.label, stroke: s.stroke, width: 2, spanGaps: true, points: { show: true, size: 7 },
        value: (u, v, si, i) => {
          if (v === null || v === undefined || i === null) return '—';
          const std = s.std[i];
          return `${fmt(v)}${std === null || std === undefined ? '' : ` ± ${fmt(std)}`}${s.yarn[i] ? ' (YaRN)' : ''}`;
        },
      }))],
    plugins: [errorBarPlugin(() => series.map((s) => s.std))],
  };
  return new uPlot(opts, [lengths, ...series.map((s) => s.mean)], target);
}

// The plot area as a clip path, so that bands and bars drawn by hand stay inside it.
function clipToPlot(u, ctx) {
  const { left, top, width, height } = u.bbox;
  ctx.beginPath();
  ctx.rect(left, top, width, height);
  ctx.clip();
}

// Filled mean ± std bands under the lines (drawn before the series): `bands()` returns
// [{seriesIdx, lo: [], hi: [], fill}] aligned with u.data[0]; a band spans where lo or hi is null.
function bandPlugin(bands) {
  return {
    hooks: {
      drawAxes: [(u) => {
        const ctx = u.ctx;
        const [ymin, ymax] = [u.scales.y.min, u.scales.y.max];
        const y = (v) => u.valToPos(Math.min(ymax, Math.max(ymin, v)), 'y', true);
        const ok = (b, i) => b.lo[i] !== null && b.hi[i] !== null && Number.isFinite(b.lo[i]) && Number.isFinite(b.hi[i]);
        ctx.save();
        clipToPlot(u, ctx);
        for (const b of bands()) {
          if (!u.series[b.seriesIdx]?.show) continue;
          ctx.fillStyle = b.fill;
          // Over the points it has, spanning the x of other series between them (bands on x
          // axes of their own, each variant's tokens or FLOPs), as its line spans them.
          const at = [];
          for (let i = 0; i < u.data[0].length; i++) if (ok(b, i)) at.push(i);
          if (at.length >= 2) {
            ctx.beginPath();
            at.forEach((k, n) => ctx[n === 0 ? 'moveTo' : 'lineTo'](u.valToPos(u.data[0][k], 'x', true), y(b.hi[k])));
            for (let n = at.length - 1; n >= 0; n--) ctx.lineTo(u.valToPos(u.data[0][at[n]], 'x', true), y(b.lo[at[n]]));
            ctx.closePath();
            ctx.fill();
          }
        }
        ctx.restore();
      }],
    },
  };
}

// Ticks of a log axis over [lo, hi]: even steps when it spans less than a factor of 3 (a decade's
// marks would leave it bare), else 1-9, 1-2-5 or 1 per decade, whichever gives at most `target`.
export function logSplits(lo, hi, target = 6) {
  if (!(lo > 0) || !(hi > lo)) return [];
  if (hi / lo < 3) {
    const raw = (hi - lo) / target;
    const p = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((s) => s >= raw);
    const out = [];
    for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi; k++) out.push(+(k * step).toPrecision(12));
    return out;
  }
  let out = [];
  for (const mantissas of [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 5], [1]]) {
    out = [];
    for (let e = Math.floor(Math.log10(lo)); 10 ** e <= hi; e++) {
      for (const m of mantissas) {
        const v = +(m * 10 ** e).toPrecision(12);
        if (v >= lo && v <= hi) out.push(v);
      }
    }
    if (out.length <= target + 1) break;
  }
  return out;
}

// A y scale and axis that fit `values` (and, on a log scale, ticks that suit the span): uPlot's own
// log range rounds out to whole decades, which flattens a loss between 1.4 and 1.8.
function fittedY(values, log, yLabel) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) {
    if (v === null || v === undefined || !Number.isFinite(v) || (log && v <= 0)) continue;
    lo = Math.min(lo, v);
    hi = Math.max(hi, v);
  }
  const axis = { label: yLabel, size: 60 };
  if (!(hi >= lo)) return { scale: log ? { distr: 3 } : {}, axis };
  if (!log) return { scale: { range: () => uPlot.rangeNum(lo, hi, 0.1, true) }, axis };
  const [a, b] = hi / lo < 1.01 ? [lo / 1.1, hi * 1.1] : [lo / 1.04, hi * 1.04];
  return {
    scale: { distr: 3, range: () => [a, b] },
    axis: { ...axis, splits: () => logSplits(a, b),
      values: (u, ticks) => ticks.map((t) => (t === null || t === undefined ? '' : String(+t.toPrecision(6)))) },
  };
}

// A colour with an alpha: '#rrggbb' or 'hsl(h, s%, l%)' -> the same colour at `alpha`.
export function withAlpha(color, alpha) {
  if (color.startsWith('#') && color.length === 7) {
    const [r, g, b] = [1, 3, 5].map((i) => parseInt(color.slice(i, i + 2), 16));
    return `rgba(${r},${g},${b},${alpha})`;
  }
  if (color.startsWith('hsl(')) return color.replace('hsl(', 'hsla(').replace(')', `, ${alpha})`);
  return color;
}

// Mean ± std bands over steps: one line per band (its mean, the std as a filled band under it),
// `lines` drawn dashed on their own steps (diverged runs), red triangles at `spikes`
// ([{seriesIdx, step, value}], seriesIdx counting bands, then lines, from 1).
// bands: [{label, stroke, mean: [], std: [], steps (optional: its own x)}] on `steps` (any x:
// `xLabel` names it); lines: [{label, stroke, step, value}].
export function bandChart(target, { title, steps, bands, lines = [], spikes = [], log = true,
  height = 380, yLabel = 'loss', xLabel = 'step' }) {
  const width = Math.max(320, target.clientWidth - 14);
  const data = joinSeries([...bands.map((b) => ({ step: b.steps || steps, value: b.mean })), ...lines]);
  const index = new Map();
  data[0].forEach((x, i) => index.set(x, i));
  const edges = bands.map((b, k) => {
    const lo = new Array(data[0].length).fill(null);
    const hi = new Array(data[0].length).fill(null);
    (b.steps || steps).forEach((step, i) => {
      const m = b.mean[i], s = b.std[i];
      if (m === null || s === null || !Number.isFinite(m) || !Number.isFinite(s)) return;
      lo[index.get(step)] = m - s;
      hi[index.get(step)] = m + s;
    });
    return { seriesIdx: k + 1, lo, hi, fill: withAlpha(b.stroke, 0.18) };
  });
  const y = fittedY([...edges.flatMap((e) => [...e.lo, ...e.hi]), ...data.slice(1).flat()], log, yLabel);
  const opts = {
    title,
    width,
    height,
    legend: { show: true },
    cursor: { drag: { x: true, y: false } },
    scales: { x: { time: false }, y: y.scale },
    axes: [{ label: xLabel }, y.axis],
    series: [{ label: xLabel },
      ...bands.map((b) => ({ label: b.label, stroke: b.stroke, width: 1.5, spanGaps: true, points: { show: false } })),
      ...lines.map((l) => ({ label: l.label, stroke: l.stroke, width: 1, dash: [5, 3], spanGaps: true, points: { show: false } }))],
    plugins: [bandPlugin(() => edges), spikePlugin(() => spikes)],
  };
  return new uPlot(opts, data, target);
}

// One bar per category with mean ± std error bars: `interim[i]` bars in a second, lighter series
// (values of runs still training). The y axis fits the error bars and does not start at 0.
export function meanBarChart(target, { title, labels, mean, std, interim, yLabel, height = 300 }) {
  const width = Math.max(300, target.clientWidth - 14);
  const xs = labels.map((_, i) => i);
  let lo = Infinity, hi = -Infinity;
  mean.forEach((m, i) => {
    if (m === null || !Number.isFinite(m)) return;
    const d = Number.isFinite(std[i]) ? std[i] : 0;
    lo = Math.min(lo, m - d);
    hi = Math.max(hi, m + d);
  });
  const pad = hi > lo ? (hi - lo) : Math.abs(hi) * 0.05 || 1;
  const pick = (want) => mean.map((m, i) => (Boolean(interim[i]) === want ? m : null));
  const bars = uPlot.paths.bars({ size: [0.7, 80] });
  const opts = {
    title,
    width,
    height,
    legend: { show: interim.some(Boolean) },
    cursor: { drag: { x: false, y: false } },
    scales: {
      x: { time: false, range: [-0.5, Math.max(0.5, labels.length - 0.5)] },
      y: { range: () => [lo - 0.25 * pad, hi + 0.08 * pad] },
    },
    axes: [
      { values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? labels[t] ?? '' : '')), rotate: labels.length > 6 ? -30 : 0,
        size: labels.length > 6 ? 30 + 5.5 * Math.min(28, Math.max(...labels.map((l) => l.length))) : 50 },
      { label: yLabel, size: 60 },
    ],
    series: [{},
      { label: 'final (SUCCEEDED seeds)', fill: '#2f6fdedd', stroke: '#1d2330', width: 0, points: { show: false }, paths: bars },
      { label: 'interim (runs still training)', fill: '#e69a1788', stroke: '#1d2330', width: 0, points: { show: false }, paths: bars }],
    plugins: [errorBarPlugin(() => [pick(false).map((m, i) => (m === null ? null : std[i])),
      pick(true).map((m, i) => (m === null ? null : std[i]))])],
  };
  return new uPlot(opts, [xs, pick(false), pick(true)], target);
}

// Lines with points and mean ± std error bars over integer x (layers): `series`
// [{label, stroke, mean: [], std: [], dash}] aligned with `xs`.
export function errorLineChart(target, { title, xs, series, xLabel, yLabel, log = false, height = 320 }) {
  const width = Math.max(300, target.clientWidth - 14);
  const y = fittedY(series.flatMap((s) => s.mean.flatMap((m, i) => (m === null ? [] : [m, m - (s.std[i] || 0), m + (s.std[i] || 0)]))), log, yLabel);
  const opts = {
    title,
    width,
    height,
    legend: { show: true },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: false, range: [xs[0] - 0.4, xs[xs.length - 1] + 0.4] }, y: y.scale },
    axes: [{ label: xLabel, ...(xs.length <= 32 ? { splits: () => xs } : {}),
      values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : '')) },
      y.axis],
    series: [{ label: xLabel },
      ...series.map((s) => ({ label: s.label, stroke: s.stroke, width: 1.5, dash: s.dash ? [5, 3] : undefined,
        spanGaps: true, points: { show: true, size: 6 } }))],
    plugins: [errorBarPlugin(() => series.map((s) => s.std))],
  };
  return new uPlot(opts, [xs, ...series.map((s) => s.mean)], target);
}

// Viridis, perceptually uniform and readable in grey: 10 samples of matplotlib's map,
// interpolated linearly. t in [0, 1] -> [r, g, b].
const VIRIDIS = ['#440154', '#482878', '#3e4989', '#31688e', '#26828e', '#1f9e89', '#35b779',
  '#6ece58', '#b5de2b', '#fde725'].map((h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16)));

export function viridis(t) {
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, j) => Math.round(c + f * (VIRIDIS[i + 1][j] - c)));
}

// The colour of each stored probability byte b = round(255 p): viridis at sqrt(p). Attention is
// near 0 almost everywhere but at the sinks; the square root keeps the rest visible.
const ATTENTION_COLORS = Array.from({ length: 256 }, (_, b) => viridis(Math.sqrt(b / 255)));
const ATTENTION_SIDE = 256;  // CSS pixels of a heatmap side

// One attention map: `probs` (size * size bytes as numbers, row-major, row = query) drawn with
// query down the y axis and key along the x axis, hovering reads a cell out. Returns the element.
export function attentionHeatmap({ layer, head, size, probs }) {
  const cell = Math.max(1, Math.floor(ATTENTION_SIDE / size));
  const side = cell * size;
  const canvas = el('canvas', { class: 'heatmap', width: side, height: side,
    'aria-label': `attention map of layer ${layer}, ${head < 0 ? 'the mean over its heads' : `head ${head}`}: query on the y axis, key on the x axis` });
  const ctx = canvas.getContext('2d');
  const image = ctx.createImageData(side, side);
  for (let q = 0; q < size; q++) {
    for (let k = 0; k < size; k++) {
      const [r, g, b] = ATTENTION_COLORS[probs[q * size + k] ?? 0];
      for (let y = q * cell; y < (q + 1) * cell; y++) {
        for (let x = k * cell, o = (y * side + x) * 4; x < (k + 1) * cell; x++, o += 4) {
          image.data[o] = r;
          image.data[o + 1] = g;
          image.data[o + 2] = b;
          image.data[o + 3] = 255;
        }
      }
    }
  }
  ctx.putImageData(image, 0, 0);
  const readout = el('div', { class: 'muted readout' }, '\u00a0');
  canvas.addEventListener('mousemove', (e) => {
    const rect = canvas.getBoundingClientRect();
    const k = Math.min(size - 1, Math.floor(((e.clientX - rect.left) / rect.width) * size));
    const q = Math.min(size - 1, Math.floor(((e.clientY - rect.top) / rect.height) * size));
    readout.textContent = `query ${q}, key ${k}: p ≈ ${(probs[q * size + k] / 255).toFixed(3)}`;
  });
  canvas.addEventListener('mouseleave', () => { readout.textContent = '\u00a0'; });
  return el('div', { class: 'chart heatmap-box', 'data-layer': layer, 'data-head': head },
    el('h3', {}, head < 0 ? `layer ${layer}, mean of heads` : `layer ${layer}, head ${head}`),
    el('div', { class: 'heatmap-frame' },
      el('div', { class: 'axis-y' }, el('span', {}, '0'), el('span', { class: 'axis-name' }, 'query'), el('span', {}, size - 1)),
      canvas,
      el('span'),
      el('div', { class: 'axis-x', style: `width:${side}px` }, el('span', {}, '0'), el('span', { class: 'axis-name' }, 'key'), el('span', {}, size - 1))),
    readout);
}

// The colour scale of attentionHeatmap: a bar over sqrt(p) with ticks at probabilities.
export function attentionLegend() {
  const width = ATTENTION_SIDE;
  const canvas = el('canvas', { id: 'attention-legend', width, height: 12 });
  const ctx = canvas.getContext('2d');
  for (let x = 0; x < width; x++) {
    const [r, g, b] = viridis(x / (width - 1));
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x, 0, 1, 12);
  }
  const ticks = el('div', { class: 'legend-ticks', style: `width:${width}px` },
    [0, 0.01, 0.1, 0.25, 0.5, 1].map((p) =>
      el('span', { style: `left:${(Math.sqrt(p) * 100).toFixed(1)}%` }, String(p))));
  return el('div', { class: 'attention-legend' },
    el('div', {}, canvas, ticks),
    el('span', { class: 'muted' }, 'attention probability p (viridis on √p: the small probabilities away from the sinks stay visible; stored to 1/255)'));
}

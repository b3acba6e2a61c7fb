// uPlot helpers: line charts over steps with spike markers, EMA smoothing, bar charts by layer, a
// metric against evaluation length with error bars; and attention-map heatmaps on a plain
// canvas, with their colour scale.
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
  height = 320, yLabel = '' }) {
  const width = Math.max(320, target.clientWidth - 14);
  const opts = {
    title,
    width,
    height,
    legend: { show: series.length <= 6 },
    cursor: { drag: { x: true, y: false } },
    scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
    axes: [{ label: 'step' }, { label: yLabel, size: 60 }],
    series: [{ label: 'step' }, ...series.map((s) => ({
      label: s.label, stroke: s.stroke, width: s.width || 1, spanGaps: true, points: { show: false },
    }))],
    plugins: [spikePlugin(spikes)],
  };
  return new uPlot(opts, data, target);
}

// Bars over layers (M-Act, F-Attn per layer) or histogram bins.
export function barChart(target, { title, labels, values, xLabel, yLabel, color = '#2f6fde',
  height = 220 }) {
  const width = Math.max(300, target.clientWidth - 14);
  const xs = labels.map((_, i) => i);
  const opts = {
    title,
    width,
    height,
    legend: { show: false },
    scales: {
      x: { time: false, range: [-0.5, Math.max(0.5, labels.length - 0.5)] },
      y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.08 : 1] },
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
    'aria-label': `attention map of layer ${layer}, head ${head}: query on the y axis, key on the x axis` });
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
    el('h3', {}, `layer ${layer}, head ${head}`),
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

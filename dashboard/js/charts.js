// uPlot helpers: line charts over steps with spike markers, EMA smoothing, bar charts by layer.
/* global uPlot */

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

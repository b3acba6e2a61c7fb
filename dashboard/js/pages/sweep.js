// #/sweep/NAME : the run table and the overlaid curves of every run, growing live from the
// stream, with spike markers, diverged runs in red and an alert when a run spikes or diverges.
// A large sweep (more than GROUP_FROM runs) draws one mean ± std band per variant instead, its
// diverged runs apart, with a toggle back to every run.
import { api, openStream } from '../api.js';
import { bandChart, ema, joinSeries, lineChart } from '../charts.js';
import { el, num, count, duration, stateBadge, runColor, DIVERGED_COLOR, tagList, noteItem } from '../format.js';
import { progressBar } from './sweeps.js';

const CURVE_POINTS = 500;      // per run, sampled by the server on a grid shared by the runs
// What the curves are plotted against (the API's `x`): steps, tokens seen, FLOPs spent or
// training seconds, so that variants of different cost per step compare at equal compute.
export const X_AXES = [['step', 'step'], ['tokens', 'tokens seen'], ['flops', 'FLOPs spent'], ['time', 'training seconds']];
const MAX_LIVE_POINTS = 4000;  // per run in the browser: older points are thinned beyond this
const GROUP_FROM = 30;         // runs past which the curves are grouped by variant at first
const GROUPED_REDRAW_MS = 1000;  // a grouped chart is rebuilt for live points at most this often

export async function render(view, ctx, name) {
  ctx.crumbs([[null, name], [`#/compare/${encodeURIComponent(name)}`, 'compare']]);
  const state = {
    sweep: null,
    tags: [],           // the sweep's own (`ablate tag`), and the notes on it and its runs
    notes: [],
    runs: new Map(),    // id -> run row (from the API, updated by `run` events)
    // id -> {step: [], value: [], x: [] (the chosen x of each point), scale (x per step for tokens
    // and FLOPs), spikes: [{step, value, kind}]}
    curves: new Map(),
    metric: 'loss',
    x: 'step',
    log: false,
    smooth: 0,
    group: null,        // null: by the sweep's size, once its runs are known
    variants: [],       // in the order of their first run (not diverged): their colours, grouped
    drawnAt: 0,         // when the grouped chart was last built
    chart: null,
    chartKey: '',
    dirty: false,
  };

  const header = el('div');
  const controls = el('div', { class: 'controls' },
    el('label', {}, 'metric', el('select', { id: 'metric', onchange: (e) => { state.metric = e.target.value; reloadCurves(); } },
      el('option', { value: 'loss' }, 'train loss'), el('option', { value: 'grad_norm' }, 'gradient norm'))),
    el('label', {}, 'against', el('select', { id: 'x-axis', onchange: (e) => { state.x = e.target.value; reloadCurves(); } },
      X_AXES.map(([value, label]) => el('option', { value }, label)))),
    el('label', {}, el('input', { type: 'checkbox', id: 'log', onchange: (e) => { state.log = e.target.checked; redraw(true); } }), 'log scale'),
    el('label', { title: 'one mean ± std band per variant (diverged runs apart), or every run' },
      el('input', { type: 'checkbox', id: 'group', onchange: (e) => { state.group = e.target.checked; redraw(true); drawTable(); } }), 'group by variant'),
    el('label', {}, 'EMA smoothing', el('input', { type: 'range', id: 'smooth', min: 0, max: 0.99, step: 0.01, value: 0,
      oninput: (e) => { state.smooth = Number(e.target.value); smoothOut.textContent = state.smooth.toFixed(2); redraw(false); } })),
  );
  const smoothOut = el('span', { class: 'muted' }, '0.00');
  controls.lastChild.append(smoothOut);
  const chartBox = el('div', { class: 'chart', id: 'curves', 'data-points': 0 });
  const tbody = el('tbody');
  view.replaceChildren(header, controls, chartBox,
    el('h2', {}, 'Runs'),
    el('table', { id: 'runs' }, el('thead', {}, el('tr', {}, ['', 'run', 'variant', 'seed', 'state', 'step / total', 'last loss',
      'spikes', 'params', 'budget', 'val loss', 'tags'].map((h) => el('th', {}, h)))), tbody));

  // The stream and the sweep at once; then, once the stream's `hello` marks the moment after
  // which every point comes live, the curves (points on both are merged by step).
  let resolveHello;
  const hello = new Promise((r) => { resolveHello = r; });
  const source = openStream(name, {
    hello: () => resolveHello(),
    points: onPoints,
    run: onRun,
    spike: onSpike,
    sweep: (s) => { state.sweep = s; drawHeader(); },
  }, ctx.live);
  ctx.onLeave(() => source.close());
  const detail = await api(`sweeps/${encodeURIComponent(name)}`);  // a bad token fails here
  state.sweep = detail.sweep;
  state.tags = detail.sweep.tags || [];
  state.notes = detail.notes || [];
  for (const r of detail.runs) state.runs.set(r.id, { ...r, ...state.runs.get(r.id) });  // live wins
  if (state.group === null) {
    state.group = state.runs.size > GROUP_FROM;
    controls.querySelector('#group').checked = state.group;
  }
  drawHeader();
  drawTable();
  await Promise.race([hello, new Promise((r) => setTimeout(r, 2000))]);

  await reloadCurves();
  ctx.every(250, () => { if (state.dirty) { state.dirty = false; redraw(false); drawTable(); } });

  async function reloadCurves() {
    const body = await api(`sweeps/${encodeURIComponent(name)}/curves`, { points: CURVE_POINTS, metric: state.metric, x: state.x });
    for (const c of body.runs) {
      const old = state.curves.get(c.id);
      const x = c.x || c.step;
      // Tokens and FLOPs grow by a fixed amount a step: how much, for the live points.
      let scale = 1;
      for (let i = 0; i < c.step.length; i++) if (c.step[i] > 0 && x[i] !== null) { scale = x[i] / c.step[i]; break; }
      // Live points already received past the loaded range stay.
      const last = c.step.length ? c.step[c.step.length - 1] : 0;
      const step = [...c.step], value = [...c.value], xs = [...x];
      if (old && old.x.length === old.step.length && old.axis === state.x) {
        for (let i = 0; i < old.step.length; i++) {
          if (old.step[i] > last) { step.push(old.step[i]); value.push(old.value[i]); xs.push(old.x[i]); }
        }
      }
      state.curves.set(c.id, { step, value, x: xs, scale, axis: state.x, spikes: c.spikes });
    }
    redraw(true);
  }

  function onPoints(p) {
    if (state.metric !== 'loss' && state.metric !== 'grad_norm') return;
    let c = state.curves.get(p.run);
    if (!c) { c = { step: [], value: [], x: [], scale: 1, axis: state.x, spikes: [] }; state.curves.set(p.run, c); }
    const values = state.metric === 'loss' ? p.loss : p.grad_norm;
    const last = c.step.length ? c.step[c.step.length - 1] : 0;
    for (let i = 0; i < p.step.length; i++) {
      if (p.step[i] > last) {
        c.step.push(p.step[i]);
        c.value.push(values[i]);
        c.x.push(state.x === 'step' ? p.step[i] : state.x === 'time' ? (p.elapsed_s ? p.elapsed_s[i] : null) : p.step[i] * c.scale);
      }
    }
    if (c.step.length > MAX_LIVE_POINTS) thin(c);
    const run = state.runs.get(p.run);
    if (run) {
      run.steps_done = Math.max(run.steps_done, p.step[p.step.length - 1]);
      const l = p.loss[p.loss.length - 1];
      run.last_loss = l;
    }
    state.dirty = true;
  }

  function onRun(r) {
    const old = state.runs.get(r.id);
    state.runs.set(r.id, { ...old, ...r });
    if (r.state === 'DIVERGED' && old?.state !== 'DIVERGED') {
      ctx.alert(`Run ${r.id} (${r.variant}, seed ${r.seed}) DIVERGED at step ${r.steps_done}${r.reason ? `: ${r.reason}` : ''}`, 'diverged', `#/run/${r.id}`);
    }
    state.dirty = true;
    state.chartKey = '';  // colours change
  }

  function onSpike(s) {
    const c = state.curves.get(s.run);
    if (c) c.spikes.push({ step: s.step, signal: s.signal, kind: s.kind, value: s.value });
    const run = state.runs.get(s.run);
    if (run) run.spike_steps = (run.spike_steps || 0) + 1;
    const what = s.kind.replace('SPIKE_', '').toLowerCase();
    ctx.alert(`Run ${s.run}${run ? ` (${run.variant}, seed ${run.seed})` : ''}: ${what} spike of ${s.signal} at step ${s.step} (${num(s.value)} vs ${num(s.baseline)})`,
      s.kind === 'SPIKE_DIVERGENCE' || s.kind === 'SPIKE_NONFINITE' ? 'diverged' : 'spike', `#/run/${s.run}`);
    state.dirty = true;
  }

  function runsInOrder() {
    return [...state.runs.values()].sort((a, b) => a.run_index - b.run_index);
  }

  function drawHeader() {
    const s = state.sweep;
    if (!s) return;
    header.replaceChildren(
      el('h1', {}, s.name, ' ', stateBadge(s.state)),
      el('div', { class: 'controls' }, progressBar(s),
        el('span', {}, `${s.by_state.RUNNING} running, ${s.by_state.SUCCEEDED} succeeded, ${s.by_state.DIVERGED} diverged, ${s.by_state.FAILED} failed, ${s.by_state.PENDING} pending${s.by_state.STOPPED ? `, ${s.by_state.STOPPED} stopped by the tuner` : ''}`),
        el('span', { class: 'muted' }, `ETA ${duration(s.eta_s)}`),
        s.description ? el('span', { class: 'muted' }, s.description) : null),
      // (replaceChildren would print a null as "null")
      ...(state.tags.length ? [el('div', { id: 'sweep-tags' }, tagList(state.tags))] : []),
      ...(state.notes.length ? [el('ul', { id: 'sweep-notes' }, state.notes.map(noteItem))] : []));
  }

  // A tuned run's place in successive halving: waiting at its rung for the tuner, or training
  // toward the next one.
  function rungNote(r) {
    if (r.held) return el('span', { class: 'muted rung' }, ` waiting at step ${r.steps_done}`);
    if (r.stop_at_step > 0 && (r.state === 'PENDING' || r.state === 'RUNNING')) {
      return el('span', { class: 'muted rung' }, ` to rung ${r.stop_at_step}`);
    }
    return null;
  }

  // Grouped, a run takes its variant's colour (the variants in the order of their first run).
  function colorOf(run, i) {
    if (run.state === 'DIVERGED') return DIVERGED_COLOR;
    if (!state.group) return runColor(i);
    return runColor(Math.max(0, state.variants.indexOf(run.variant)));
  }

  function drawTable() {
    const ordered = runsInOrder();
    state.variants = [...new Set(ordered.filter((r) => r.state !== 'DIVERGED').map((r) => r.variant))];
    const rows = ordered.map((r, i) => el('tr', { class: r.state === 'DIVERGED' ? 'diverged' : '', 'data-run': r.id },
      el('td', {}, el('span', { class: 'swatch', style: `background:${colorOf(r, i)}` })),
      el('td', {}, el('a', { href: `#/run/${r.id}` }, `#${r.id}`)),
      el('td', {}, r.variant, r.axes ? el('span', { class: 'muted' }, ` ${r.axes}`) : null),
      el('td', { class: 'num' }, r.seed),
      el('td', {}, stateBadge(r.state), rungNote(r)),
      el('td', { class: 'num' }, `${r.steps_done} / ${r.steps_total}`),
      el('td', { class: 'num' }, num(r.last_loss)),
      el('td', { class: 'num' }, r.spike_steps),
      el('td', { class: 'num' }, count(r.params_total)),
      el('td', { class: 'muted' }, r.budget || '—'),
      el('td', { class: 'num' }, num(r.val_loss)),
      el('td', {}, tagList(r.tags))));
    tbody.replaceChildren(...rows);
  }

  function redraw(rebuild) {
    if (state.group) { redrawGrouped(rebuild); return; }
    const runs = runsInOrder().filter((r) => state.curves.has(r.id));
    // Each run's points at the chosen x (a point without one, an old row's time, left out).
    const list = runs.map((r) => {
      const c = state.curves.get(r.id);
      const smooth = ema(c.value, state.smooth);
      const xs = [], ys = [];
      for (let i = 0; i < c.step.length; i++) if (c.x[i] !== null && c.x[i] !== undefined) { xs.push(c.x[i]); ys.push(smooth[i]); }
      return { step: xs, value: ys };
    });
    const data = joinSeries(list);
    let points = 0;
    for (const r of runs) points += state.curves.get(r.id).step.length;
    chartBox.dataset.points = points;
    // When the curves were first drawn, in ms since navigation: the load-time benchmark reads it.
    if (points > 0 && !chartBox.dataset.drawnAt) {
      requestAnimationFrame(() => { chartBox.dataset.drawnAt = performance.now().toFixed(1); });
    }
    const key = `${state.metric}|${state.x}|${state.log}|${runs.map((r) => `${r.id}:${r.state}`).join(',')}`;
    chartBox.dataset.grouped = '';
    chartBox.dataset.series = runs.length;
    if (rebuild || !state.chart || key !== state.chartKey) {
      if (state.chart) state.chart.destroy();
      chartBox.replaceChildren();
      const spikes = () => runs.flatMap((r, i) => state.curves.get(r.id).spikes
        .filter((s) => s.signal === state.metric || state.metric === 'loss')
        .map((s) => ({ seriesIdx: i + 1, step: xAt(r.id, s.step), value: valueAt(r.id, s.step) ?? s.value }))
        .filter((s) => s.step !== null));
      state.chart = lineChart(chartBox, {
        title: state.metric === 'loss' ? 'Training loss' : 'Gradient norm',
        yLabel: state.metric,
        xLabel: X_AXES.find(([v]) => v === state.x)[1],
        log: state.log,
        spikes,
        height: 380,
        series: runs.map((r, i) => ({
          label: `#${r.id} ${r.variant} s${r.seed}`, stroke: colorOf(r, i), width: r.state === 'DIVERGED' ? 2.5 : 1.25,
        })),
        data,
      });
      state.chartKey = key;
    } else {
      state.chart.setData(data);
    }
  }

  // One band per variant: at each step its runs share (the server samples every run on one grid),
  // the mean and sample std of their (smoothed) values, at the mean of their x there; a diverged
  // run is a line of its own. Rebuilt for live points at most every GROUPED_REDRAW_MS.
  function redrawGrouped(rebuild) {
    if (!rebuild && state.chart && performance.now() - state.drawnAt < GROUPED_REDRAW_MS) { state.dirty = true; return; }
    const runs = runsInOrder().filter((r) => state.curves.has(r.id));
    const variants = [];
    const byVariant = new Map();
    const lines = [];
    let points = 0;
    for (const r of runs) {
      const c = state.curves.get(r.id);
      points += c.step.length;
      const smooth = ema(c.value, state.smooth);
      if (r.state === 'DIVERGED') {
        const xs = [], ys = [];
        for (let i = 0; i < c.step.length; i++) if (c.x[i] !== null && c.x[i] !== undefined) { xs.push(c.x[i]); ys.push(smooth[i]); }
        lines.push({ label: `#${r.id} ${r.variant} s${r.seed} (diverged)`, stroke: DIVERGED_COLOR, step: xs, value: ys });
        continue;
      }
      if (!byVariant.has(r.variant)) { byVariant.set(r.variant, { runs: 0, at: new Map() }); variants.push(r.variant); }
      const g = byVariant.get(r.variant);
      g.runs++;
      for (let i = 0; i < c.step.length; i++) {
        const v = smooth[i];
        if (c.x[i] === null || c.x[i] === undefined || v === null || !Number.isFinite(v)) continue;
        let a = g.at.get(c.step[i]);
        if (!a) { a = { x: 0, n: 0, sum: 0, sq: 0 }; g.at.set(c.step[i], a); }
        a.x += c.x[i]; a.n++; a.sum += v; a.sq += v * v;
      }
    }
    const grid = new Set();
    const series = variants.map((v) => {
      const points = new Map();
      for (const a of byVariant.get(v).at.values()) {
        const x = a.x / a.n, mean = a.sum / a.n;
        const std = a.n > 1 ? Math.sqrt(Math.max(0, (a.sq - a.n * mean * mean) / (a.n - 1))) : null;
        points.set(x, [mean, std]);
        grid.add(x);
      }
      return points;
    });
    const steps = [...grid].sort((a, b) => a - b);
    const bands = variants.map((v, k) => ({
      label: `${v} (${byVariant.get(v).runs} runs)`, stroke: runColor(state.variants.includes(v) ? state.variants.indexOf(v) : k),
      mean: steps.map((x) => series[k].get(x)?.[0] ?? null), std: steps.map((x) => series[k].get(x)?.[1] ?? null),
    }));
    if (state.chart) state.chart.destroy();
    chartBox.replaceChildren();
    chartBox.dataset.points = points;
    chartBox.dataset.grouped = '1';
    chartBox.dataset.series = bands.length + lines.length;
    if (points > 0 && !chartBox.dataset.drawnAt) {
      requestAnimationFrame(() => { chartBox.dataset.drawnAt = performance.now().toFixed(1); });
    }
    state.chart = bandChart(chartBox, {
      title: `${state.metric === 'loss' ? 'Training loss' : 'Gradient norm'}: mean ± std over each variant's runs`,
      steps, bands, lines, log: state.log, yLabel: state.metric, xLabel: X_AXES.find(([v]) => v === state.x)[1],
    });
    state.chartKey = '';
    state.drawnAt = performance.now();
  }

  // The chosen x of a run's step (a spike's): from its point, else from its scale.
  function xAt(id, step) {
    const c = state.curves.get(id);
    const i = c.step.indexOf(step);
    if (i >= 0) return c.x[i] ?? null;
    return state.x === 'step' ? step : state.x === 'time' ? null : step * c.scale;
  }

  function valueAt(id, step) {
    const c = state.curves.get(id);
    let lo = 0, hi = c.step.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (c.step[mid] === step) return c.value[mid];
      if (c.step[mid] < step) lo = mid + 1; else hi = mid - 1;
    }
    return null;
  }
}

// Keeps the newest quarter of a live curve whole and every other point of the rest.
function thin(c) {
  const keepFrom = Math.floor(c.step.length * 0.75);
  const step = [], value = [], x = [];
  for (let i = 0; i < c.step.length; i++) {
    if (i >= keepFrom || i % 2 === 0) { step.push(c.step[i]); value.push(c.value[i]); x.push(c.x[i]); }
  }
  c.step = step;
  c.value = value;
  c.x = x;
}

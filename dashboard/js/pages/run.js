// #/run/ID : loss, validation loss, gradient norm and learning rate against steps, tokens seen,
// FLOPs spent or training seconds (a selector, as on the sweep page); per-layer M-Act,
// F-Attn, the gate-score histogram and the stored attention maps at each evaluation; spike
// events; the config. A program run's page shows its output too (the last lines of an attempt's
// log, read from the coordinator machine's checkpoint root). While the run trains, everything is
// refreshed in place every few seconds.
import { api, Unauthorized } from '../api.js';
import { attentionHeatmap, attentionLegend, barChart, lineChart } from '../charts.js';
import { X_AXES } from './sweep.js';
import { el, num, count, time, stateBadge, tagList, noteItem } from '../format.js';

const REFRESH_MS = 3000;
const LOG_LINES = 200;

// The sink-rate threshold the run's probes used: train.sink_epsilon, 0 or absent read as 0.3.
function sinkEpsilon(run) {
  return (run.config && typeof run.config === 'object' && run.config.train?.sink_epsilon) || 0.3;
}

// First-token attention per layer and head (the paper's F-Attn averages the heads, which hides
// one sink head): a table, the heads over ε in the sink-rate window marked.
function sinkHeadTable(layers, epsilon) {
  const heads = Math.max(0, ...layers.map((l) => (l.f_attn_by_head || []).length));
  if (heads === 0) return null;
  return el('div', { class: 'chart', id: 'sink-heads' },
    el('h3', {}, 'First-token attention per head'),
    el('p', { class: 'muted' }, `Each cell: attention on key 0, over query positions > 0 (in brackets: over positions 1-63, the sink-rate window). Bold: a sink head, over ε = ${epsilon} in the window.`),
    el('table', {},
      el('thead', {}, el('tr', {}, el('th', {}, 'layer'), ...Array.from({ length: heads }, (_, h) => el('th', {}, `head ${h}`)))),
      el('tbody', {}, layers.map((l) => el('tr', {}, el('td', {}, String(l.layer)),
        ...Array.from({ length: heads }, (_, h) => {
          const all = l.f_attn_by_head?.[h];
          const win = l.sink_window_by_head?.[h];
          const text = all == null ? '—' : `${num(all, 3)}${win == null ? '' : ` (${num(win, 3)})`}`;
          return el('td', { class: win != null && win > epsilon ? 'sink' : '' }, win != null && win > epsilon ? el('strong', {}, text) : text);
        }))))));
}

// F-Attn and the gate score by query class, where the data defines classes (bigram-backcopy:
// trigger and non_trigger queries).
function queryClassTable(layers) {
  const rows = layers.flatMap((l) => (l.classes || []).map((c) => ({ layer: l.layer, ...c })));
  if (rows.length === 0) return null;
  return el('div', { class: 'chart', id: 'query-classes' },
    el('h3', {}, 'By query class'),
    el('table', {},
      el('thead', {}, el('tr', {}, ['layer', 'class', 'queries', 'F-Attn', 'gate score'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows.map((r) => el('tr', {}, el('td', {}, String(r.layer)), el('td', {}, r.name),
        el('td', {}, count(r.queries)), el('td', {}, num(r.f_attn, 3)), el('td', {}, r.gate_mean == null ? '—' : num(r.gate_mean, 3)))))));
}

function headerNodes(run) {
  return [
    el('h1', {}, `Run #${run.id}: ${run.variant} (seed ${run.seed}) `, stateBadge(run.state)),
    el('dl', { class: 'kv' },
      el('dt', {}, 'sweep'), el('dd', {}, el('a', { href: `#/sweep/${encodeURIComponent(run.sweep)}` }, run.sweep)),
      el('dt', {}, 'steps'), el('dd', { id: 'run-steps' }, `${run.steps_done} / ${run.steps_total}`),
      el('dt', {}, 'axes'), el('dd', {}, run.axes || '—'),
      el('dt', {}, 'devices'), el('dd', { id: 'run-devices' }, run.devices > 1 ? `${run.devices} ranks, data parallel` : '1'),
      el('dt', {}, 'params'), el('dd', {}, `${count(run.params_total)} total, ${count(run.params_activated)} activated, ${count(run.params_added, true)} added`),
      el('dt', {}, 'val loss / PPL'), el('dd', {}, `${num(run.val_loss)} / ${num(run.val_ppl, 2)}`),
      el('dt', {}, 'gate score, M-Act, F-Attn'), el('dd', {}, `${num(run.gate_score, 3)}, ${num(run.m_act, 1)}, ${num(run.f_attn, 3)}`),
      el('dt', {}, 'sink rate'), el('dd', { id: 'run-sink-rate' }, run.sink_rate == null ? '—'
        : `${num(run.sink_rate, 3)} of heads (ε ${sinkEpsilon(run)})`),
      el('dt', {}, 'spike score'), el('dd', {}, `${num(run.spike_score)} (${run.spike_steps} steps)`),
      el('dt', {}, 'attempts'), el('dd', {}, `${run.attempts}${run.reason ? ` — ${run.reason}` : ''}`),
      el('dt', {}, 'started / finished'), el('dd', {}, `${time(run.started_at)} / ${time(run.finished_at)}`),
      el('dt', {}, 'tags'), el('dd', { id: 'run-tags' }, run.tags?.length || run.sweep_tags?.length
        ? [tagList(run.tags), run.sweep_tags?.length ? el('span', { class: 'muted' }, 'from the sweep: ', tagList(run.sweep_tags)) : null]
        : '—')),
    run.notes?.length ? el('ul', { id: 'run-notes' }, run.notes.map(noteItem)) : null,
  ].filter((n) => n);
}

// A program run's output (docs/program.md, "Logs"), the last LOG_LINES lines of an attempt: the
// last one, following new ones, or the one chosen. The lines are the program's, untrusted: they
// are only ever set as text. load() is quiet about a run that has not started; a log the
// coordinator's machine does not have (a worker elsewhere) shows the server's message.
function logView(run, id) {
  const box = el('div', { id: 'log' });
  const attemptSelect = el('select', { id: 'log-attempt', 'aria-label': 'attempt' });
  const note = el('p', { class: 'muted', id: 'log-note' });
  const text = el('pre', { class: 'log', id: 'log-text' });
  let shown = null;  // the attempts of the last answer, or null before one
  let chosen = null;  // the attempt asked for; null: the last one
  let missing = false;
  let loading = 0;  // when a refresh and a choice cross, the last one asked for is shown
  const load = async () => {
    if (run.attempts === 0) {
      box.replaceChildren(el('p', { class: 'muted', id: 'no-log' }, 'No output yet: the run has not started.'));
      return;
    }
    const ticket = ++loading;
    let body;
    try {
      body = await api(`runs/${id}/log`, chosen === null ? { tail: LOG_LINES } : { tail: LOG_LINES, attempt: chosen });
    } catch (err) {
      if (err instanceof Unauthorized) throw err;
      if (ticket !== loading) return;
      missing = true;
      box.replaceChildren(el('p', { class: 'muted', id: 'no-log' }, String(err.message || err)));
      return;
    }
    if (ticket !== loading) return;
    missing = false;
    if (shown === null || shown.join() !== body.attempts.join()) {
      shown = body.attempts;
      attemptSelect.replaceChildren(...[...shown].reverse().map((a, i) =>
        el('option', { value: String(a) }, i === 0 ? `attempt ${a} (the last)` : `attempt ${a}`)));
    }
    attemptSelect.value = String(body.attempt);
    const atEnd = text.scrollHeight - text.scrollTop - text.clientHeight < 8;
    text.textContent = body.lines.join('\n');
    note.textContent = `Attempt ${body.attempt}: ${body.truncated ? `the last ${body.lines.length} lines` : `${body.lines.length} lines`} of ${body.path}`;
    box.dataset.attempt = body.attempt;
    box.dataset.lines = body.lines.length;
    if (!box.contains(text)) {
      box.replaceChildren(el('div', { class: 'controls' }, note, shown.length > 1 ? el('label', {}, 'attempt', attemptSelect) : null), text);
    } else if (shown.length > 1 && !box.contains(attemptSelect)) {
      note.after(el('label', {}, 'attempt', attemptSelect));
    }
    if (atEnd || !text.dataset.shown) text.scrollTop = text.scrollHeight;
    text.dataset.shown = '1';
  };
  attemptSelect.addEventListener('change', () => {
    chosen = attemptSelect.selectedIndex === 0 ? null : Number(attemptSelect.value);
    load();
  });
  return {
    box,
    load,
    // Asked again while the run trains (its output grows) or when it moved to another state or
    // attempt; not while the coordinator's machine has no log of it.
    async refresh(moved) {
      if (moved || (run.state === 'RUNNING' && !missing)) await load();
    },
    set run(r) { run = r; },
  };
}

function spikeTable(spikes) {
  if (spikes.length === 0) return el('p', { class: 'muted' }, 'No spike event.');
  return el('table', { id: 'spikes' },
    el('thead', {}, el('tr', {}, ['step', 'signal', 'kind', 'value', 'baseline', 'action'].map((h) => el('th', {}, h)))),
    el('tbody', {}, spikes.map((s) => el('tr', {}, el('td', { class: 'num' }, s.step), el('td', {}, s.signal),
      el('td', {}, s.kind), el('td', { class: 'num' }, num(s.value)), el('td', { class: 'num' }, num(s.baseline)),
      el('td', {}, s.action + (s.rollback_to_step ? ` → ${s.rollback_to_step}` : ''))))));
}

// The metrics by name of each evaluation (train.evals' tasks, docs/evals.md; a program's own):
// one row per metric with its chance level where the config states one, a column per evaluation
// (the last six), and the seconds each evaluation took.
function evalTaskTable(evals, chance) {
  const names = [...new Set(evals.flatMap((e) => Object.keys(e.metrics || {})))].sort();
  if (names.length === 0) return el('p', { class: 'muted', id: 'no-eval-tasks' }, 'No evaluation task (train.evals) and no metric by name.');
  const shown = evals.slice(-6);
  return el('table', { id: 'eval-tasks' },
    el('thead', {}, el('tr', {}, el('th', {}, 'metric'), el('th', { class: 'num' }, 'chance'),
      ...shown.map((e) => el('th', { class: 'num' }, `step ${e.step}`)))),
    el('tbody', {},
      ...names.map((n) => el('tr', {}, el('td', {}, n),
        el('td', { class: 'num' }, chance[n] === null || chance[n] === undefined ? '—' : num(chance[n])),
        ...shown.map((e) => el('td', { class: 'num' }, e.metrics && n in e.metrics ? num(e.metrics[n]) : '—')))),
      el('tr', { class: 'muted' }, el('td', {}, 'evaluation time'), el('td', {}, ''),
        ...shown.map((e) => el('td', { class: 'num' }, e.eval_seconds === null ? '—' : `${e.eval_seconds.toFixed(1)} s`)))));
}

export async function render(view, ctx, idText) {
  const id = Number(idText);
  let { run } = await api(`runs/${encodeURIComponent(idText)}`);
  ctx.crumbs([[`#/sweep/${encodeURIComponent(run.sweep)}`, run.sweep], [null, `run ${id}`]]);
  const header = el('div', {}, headerNodes(run));
  const charts = el('div', { class: 'grid', id: 'run-charts' });
  const probeBox = el('div');
  const attentionBox = el('div', { id: 'attention' });
  const spikeBox = el('div');
  const evalTaskBox = el('div', { id: 'eval-task-box' });
  const trainingControls = el('div', { class: 'controls' });
  // A program run (its config has a `program` block) has a log; the built-in model's runs none.
  const log = run.config && typeof run.config === 'object' && run.config.program ? logView(run, id) : null;
  view.replaceChildren(header,
    el('h2', {}, 'Training'), trainingControls, charts,
    ...(log ? [el('h2', {}, 'Log'), log.box] : []),
    el('h2', {}, 'Evaluation tasks'), evalTaskBox,
    el('h2', {}, 'Probes per layer'), probeBox,
    el('h2', {}, 'Attention maps'), attentionBox,
    el('h2', {}, 'Spike events'), spikeBox,
    el('h2', {}, 'Config'), el('pre', { class: 'config' }, JSON.stringify(run.config, null, 2)));

  let xAxis = 'step';
  const load = () => Promise.all([api(`runs/${id}/metrics`, { points: 2000, x: xAxis }), api(`runs/${id}/evals`), api(`runs/${id}/spikes`)]);
  let [metrics, { evals, chance }, { spikes }] = await load();
  evalTaskBox.replaceChildren(evalTaskTable(evals, chance || {}));
  // The chosen x of a step: itself, its tokens or FLOPs (x_per_step), or the training seconds of
  // the nearest stored step at or before it (an evaluation's, a spike's); null when unknown.
  const xOf = (step) => {
    if (xAxis === 'step') return step;
    if (xAxis !== 'time') return metrics.x_per_step === null ? null : step * metrics.x_per_step;
    let lo = 0, hi = metrics.step.length - 1, at = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (metrics.step[mid] <= step) { at = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return at < 0 ? null : metrics.x[at];
  };
  // [xs, ys] of `steps` and `values`, leaving out the points without an x (old rows' time).
  const pairs = (steps, values) => {
    const xs = [], ys = [];
    steps.forEach((step, i) => {
      const x = xAxis !== 'step' && steps === metrics.step ? metrics.x[i] : xOf(step);
      if (x !== null && x !== undefined) { xs.push(x); ys.push(values[i]); }
    });
    return [xs, ys];
  };
  const xLabel = () => X_AXES.find(([v]) => v === xAxis)[1];
  const axisSelect = el('select', { id: 'run-x-axis' }, X_AXES.map(([value, label]) => el('option', { value }, label)));
  let loss, val, grad, lr;
  const drawCharts = () => {
    charts.replaceChildren();
    const cell = () => { const box = el('div', { class: 'chart' }); charts.append(box); return box; };
    loss = lineChart(cell(), { title: 'Training loss', yLabel: 'loss', xLabel: xLabel(), height: 260,
      spikes: () => spikes.map((s) => ({ step: xOf(s.step), value: s.signal === 'loss' ? s.value : null })).filter((s) => s.step !== null),
      series: [{ label: 'loss', stroke: '#2f6fde' }], data: pairs(metrics.step, metrics.loss) });
    val = lineChart(cell(), { title: 'Validation loss', yLabel: 'val loss', xLabel: xLabel(), height: 260,
      series: [{ label: 'val loss', stroke: '#2e9d5b', width: 2 }],
      data: pairs(evals.map((e) => e.step), evals.map((e) => e.val_loss)) });
    grad = lineChart(cell(), { title: 'Gradient norm', yLabel: 'grad norm', xLabel: xLabel(), height: 260,
      spikes: () => spikes.filter((s) => s.signal === 'grad_norm').map((s) => ({ step: xOf(s.step), value: s.value })).filter((s) => s.step !== null),
      series: [{ label: 'grad norm', stroke: '#8e44ad' }], data: pairs(metrics.step, metrics.grad_norm) });
    lr = lineChart(cell(), { title: 'Learning rate', yLabel: 'lr', xLabel: xLabel(), height: 260,
      series: [{ label: 'lr', stroke: '#e69a17' }], data: pairs(metrics.step, metrics.lr) });
    charts.dataset.points = metrics.step.length;
    charts.dataset.x = xAxis;
  };
  const updateCharts = () => {
    loss.setData(pairs(metrics.step, metrics.loss));
    grad.setData(pairs(metrics.step, metrics.grad_norm));
    lr.setData(pairs(metrics.step, metrics.lr));
    val.setData(pairs(evals.map((e) => e.step), evals.map((e) => e.val_loss)));
    charts.dataset.points = metrics.step.length;
  };
  axisSelect.addEventListener('change', async () => {
    xAxis = axisSelect.value;
    [metrics, { evals }, { spikes }] = await load();
    drawCharts();
  });
  trainingControls.append(el('label', {}, 'against', axisSelect));
  drawCharts();

  // Probes: one evaluation at a time.
  const stepSelect = el('select', { id: 'eval-step' });
  const layerSelect = el('select', { id: 'hist-layer' });
  const probeCharts = el('div', { class: 'grid' });
  let layers = [];
  const drawProbes = () => {
    probeCharts.replaceChildren();
    const box = () => { const b = el('div', { class: 'chart' }); probeCharts.append(b); return b; };
    const names = layers.map((l) => String(l.layer));
    barChart(box(), { title: 'M-Act: max |hidden state| per layer', labels: names, values: layers.map((l) => l.m_act), xLabel: 'layer', yLabel: 'M-Act' });
    barChart(box(), { title: 'F-Attn: attention on the first token per layer', labels: names, values: layers.map((l) => l.f_attn), xLabel: 'layer', yLabel: 'F-Attn', color: '#8e44ad' });
    for (const table of [sinkHeadTable(layers, sinkEpsilon(run)), queryClassTable(layers)]) {
      if (table) probeCharts.append(table);
    }
    const gated = layers.filter((l) => l.gate_histogram);
    const chosen = layerSelect.value === 'all' ? gated : gated.filter((l) => String(l.layer) === layerSelect.value);
    if (chosen.length === 0) {
      probeCharts.append(el('div', { class: 'chart muted' }, 'No gate in this model: no gate-score histogram.'));
      return;
    }
    const h0 = chosen[0].gate_histogram;
    const bins = h0.counts.map((_, i) => chosen.reduce((s, l) => s + (l.gate_histogram.counts[i] || 0), 0));
    const w = (h0.hi - h0.lo) / Math.max(1, bins.length);
    barChart(box(), { title: `Gate scores (${layerSelect.value === 'all' ? 'all layers' : `layer ${layerSelect.value}`})`,
      labels: bins.map((_, i) => (h0.lo + w * (i + 0.5)).toFixed(2)), values: bins, xLabel: 'gate score', yLabel: 'count', color: '#2e9d5b' });
  };
  // The attention maps of the same evaluation, a heatmap per layer: the mean over the layer's
  // heads (head -1) by default, one stored head, or every stored head.
  const headSelect = el('select', { id: 'attention-head', 'aria-label': 'attention head' });
  let lastMaps = { step: 0, maps: [] };
  const drawAttention = ({ step, maps }) => {
    lastMaps = { step, maps };
    attentionBox.dataset.step = step;
    attentionBox.dataset.maps = maps.length;
    if (maps.length === 0) {
      attentionBox.replaceChildren(el('p', { class: 'muted', id: 'no-attention-maps' },
        `No attention maps were stored at step ${step} (train.attention_map_heads: 0, or a run from before they existed).`));
      return;
    }
    const heads = [...new Set(maps.map((m) => m.head))].sort((a, b) => a - b);
    const choices = [...(heads.includes(-1) ? [['-1', 'mean over heads']] : []),
      ...heads.filter((h) => h >= 0).map((h) => [String(h), `head ${h}`]), ['all', 'every stored head']];
    const keep = headSelect.value;
    headSelect.replaceChildren(...choices.map(([value, label]) => el('option', { value }, label)));
    headSelect.value = choices.some(([value]) => value === keep) ? keep : choices[0][0];
    const chosen = headSelect.value === 'all' ? maps.filter((m) => m.head >= 0)
      : maps.filter((m) => m.head === Number(headSelect.value));
    attentionBox.dataset.head = headSelect.value;
    attentionBox.replaceChildren(
      el('p', { class: 'muted' }, `Step ${step}: the first ${maps[0].size} positions of one fixed validation window, `
        + 'row = query, column = key (causal: nothing above the diagonal). ', el('label', {}, 'Show: ', headSelect)),
      attentionLegend(),
      el('div', { class: 'heatmaps', id: 'attention-maps' }, chosen.map((m) => attentionHeatmap(m))));
  };
  headSelect.addEventListener('change', () => drawAttention(lastMaps));
  let loading = 0;  // when the selection changes quickly, the last one asked for is drawn
  const loadEvaluation = async () => {
    const ticket = ++loading;
    const step = stepSelect.value;
    const [body, attention] = await Promise.all([api(`runs/${id}/probes`, { step }), api(`runs/${id}/attention`, { step })]);
    if (ticket !== loading) return;
    drawAttention(attention);
    layers = body.layers;
    const keep = layerSelect.value || 'all';
    layerSelect.replaceChildren(el('option', { value: 'all' }, 'all layers'),
      ...layers.filter((l) => l.gate_histogram).map((l) => el('option', { value: l.layer }, `layer ${l.layer}`)));
    layerSelect.value = [...layerSelect.options].some((o) => o.value === keep) ? keep : 'all';
    drawProbes();
  };
  // New evaluations join the list; following the latest one stays on the latest.
  const updateEvalOptions = async () => {
    if (evals.length === stepSelect.options.length) return;
    const wasLatest = stepSelect.selectedIndex === stepSelect.options.length - 1;
    stepSelect.replaceChildren(...evals.map((e) => el('option', { value: e.step }, `step ${e.step}`)));
    if (wasLatest || stepSelect.selectedIndex < 0) {
      stepSelect.value = evals[evals.length - 1].step;
      await loadEvaluation();
    }
  };
  if (evals.length === 0) {
    probeBox.replaceChildren(el('p', { class: 'muted', id: 'no-evals' }, 'No evaluation yet.'));
    attentionBox.replaceChildren(el('p', { class: 'muted' }, 'No evaluation yet.'));
  } else {
    probeBox.replaceChildren(el('div', { class: 'controls' },
      el('label', {}, 'evaluation', stepSelect), el('label', {}, 'gate histogram of', layerSelect)), probeCharts);
    await updateEvalOptions();
  }
  stepSelect.addEventListener('change', loadEvaluation);
  layerSelect.addEventListener('change', drawProbes);
  spikeBox.replaceChildren(spikeTable(spikes));
  if (log) await log.load();

  if (run.state !== 'RUNNING' && run.state !== 'PENDING') return;
  ctx.every(REFRESH_MS, async () => {
    const before = `${run.state}|${run.steps_done}`;
    const attemptBefore = `${run.state}|${run.attempts}`;
    ({ run } = await api(`runs/${id}`));
    if (log) {
      log.run = run;
      await log.refresh(`${run.state}|${run.attempts}` !== attemptBefore);
    }
    if (`${run.state}|${run.steps_done}` === before) return;
    header.replaceChildren(...headerNodes(run));
    [metrics, { evals, chance }, { spikes }] = await load();
    evalTaskBox.replaceChildren(evalTaskTable(evals, chance || {}));
    updateCharts();
    if (evals.length > 0 && !probeBox.contains(stepSelect)) {
      probeBox.replaceChildren(el('div', { class: 'controls' },
        el('label', {}, 'evaluation', stepSelect), el('label', {}, 'gate histogram of', layerSelect)), probeCharts);
    }
    if (evals.length > 0) await updateEvalOptions();
    spikeBox.replaceChildren(spikeTable(spikes));
  });
}

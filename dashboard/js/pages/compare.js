// #/compare/NAME[/MORE...] : the `ablate table` comparison, sortable, mean ± std over seeds; the
// paired comparison against the reference (`ablate compare`: each variant's difference with its
// interval, a forest plot, p-values adjusted over the rows, verdicts), with a choice of metric;
// a tuned first sweep's metric against the tuned value with its stability brackets (tune:);
// and the first sweep's figures (figures.js, the same as `ablate report` draws): training loss as
// mean ± std bands with spike markers, validation loss bars with error bars, M-Act and F-Attn per
// layer, gate-score histograms, PPL against evaluation length when measured. More sweeps of one
// study (init_from phases, resubmissions) after the first are matched by variant, seed and axis
// point. While the first sweep is ACTIVE the page refreshes itself, and a variant with no finished
// run shows the latest evaluation of its running runs, marked interim, instead of dashes.
// Below the table, the finished runs of every sweep in parallel coordinates (parcoords.js: swept
// values, variant, final metrics), brushable, with the table of the runs inside the brushes.
import { api } from '../api.js';
import { comparisonTable, figureSections, pairedSection, tuneSection } from '../figures.js';
import { el } from '../format.js';
import { parallelCoordinates, selectedRunsTable } from '../parcoords.js';

const REFRESH_MS = 5000;
const METRICS = ['val_loss', 'val_ppl', 'm_act', 'f_attn', 'spike_score', 'gate_score', 'train_loss'];

export async function render(view, ctx, name, more = []) {
  const names = [name, ...more];
  const joined = names.map(encodeURIComponent).join('/');
  ctx.crumbs([[`#/sweep/${encodeURIComponent(name)}`, name], [null, more.length ? `compare with ${more.join(', ')}` : 'compare']]);
  let metric = 'val_loss';
  const load = () => Promise.all([
    api(`table/${joined}`), api(`sweeps/${encodeURIComponent(name)}/figures`),
    api(`compare/${joined}`, { metric }).catch(() => null), api(`sweeps/${encodeURIComponent(name)}/tune`),
    Promise.all(names.map((n) => api(`sweeps/${encodeURIComponent(n)}`)))]);
  let [table, figures, paired, tune, details] = await load();
  const compare = comparisonTable(table, figures);
  const pairedBox = el('div', { id: 'paired-box' });
  const drawPaired = () => {
    const s = pairedSection(paired);
    pairedBox.replaceChildren(...(s ? [s.section] : []));
  };
  const lengths = new Set(table.rows.flatMap((r) => (r.lengths || []).map((l) => l.seq_len)));
  // Metrics the runs report by name: train.evals' tasks (docs/evals.md), a program's own.
  const named = [...new Set(table.rows.flatMap((r) => Object.keys(r.metrics || {})))].sort();
  const choice = el('select', { id: 'paired-metric', onchange: async (e) => {
    metric = e.target.value;
    paired = await api(`compare/${joined}`, { metric }).catch(() => null);
    drawPaired();
  } }, [...METRICS, ...[...lengths].map((l) => `ppl@${l}`), ...named].map((m) => el('option', { value: m }, m)));
  const tuneBox = el('div', { id: 'tune-box' });
  const drawTune = () => {
    const s = tuneSection(tune);
    tuneBox.replaceChildren(...(s ? [s.section] : []));
  };
  const runsBox = el('div', { id: 'parcoords-table' });
  const parcoords = parallelCoordinates({
    onSelect: (runs) => {
      runsBox.replaceChildren(
        el('p', { class: 'muted', id: 'parcoords-count' }, `${runs.length} of ${parcoords.node.dataset.total} finished runs${runs.length < Number(parcoords.node.dataset.total) ? ' inside the brushes' : ''}`),
        selectedRunsTable(runs, parcoords.colourOf));
    },
  });
  const allRuns = () => details.flatMap((d) => d.runs);
  const figureBox = el('div', { id: 'figures' });
  const drawFigures = () => {
    const sections = figureSections(table, figures);
    figureBox.replaceChildren(...sections.map((s) => s.section));
    sections.forEach((s) => s.draw());  // once in the page: each chart takes its width from its box
    figureBox.dataset.state = figures.state;
    figureBox.dataset.interim = figures.groups.filter((g) => g.interim).length;
  };
  view.replaceChildren(
    el('h1', {}, `Compare: ${names.join(' + ')}`),
    el('p', { class: 'muted' }, 'Means ± sample std over the SUCCEEDED seeds of each variant; diverged runs are counted, not averaged. Click a header to sort.'),
    compare.node,
    el('p', {}, 'Paired comparison of ', choice),
    pairedBox, tuneBox,
    el('section', { id: 'parcoords-section' },
      el('h2', {}, 'Runs in parallel coordinates'),
      el('p', { class: 'muted' }, 'One line per finished run, in its variant\'s colour, across the swept values, the variant and the final metrics. Drag along an axis to keep a range (on several axes: a run must be in each); click the axis to clear it.'),
      parcoords.node, runsBox),
    figureBox);
  parcoords.setRuns(allRuns());
  drawPaired();
  drawTune();
  drawFigures();
  if (figures.state !== 'ACTIVE') return;
  ctx.every(REFRESH_MS, async () => {
    if (figures.state !== 'ACTIVE') return;  // the last refresh saw it end
    [table, figures, paired, tune, details] = await load();
    compare.update(table, figures);
    parcoords.setRuns(allRuns());
    drawPaired();
    drawTune();
    drawFigures();
  });
}

// The page of `ablate report`'s index.html: everything from the JSON embedded in the page (no
// server, no network), drawn with the dashboard's own modules, which the report inlines before this
// one (format.js, charts.js, figures.js). Sets body[data-ready] once every chart is drawn, or
// body[data-error] with the message.
import { comparisonTable, figureSections, pairedSection, tuneSection } from './figures.js';
import { el, count, num, tagList } from './format.js';

function reportHeader(data) {
  const { sweep, source } = data;
  return [
    el('h1', {}, `Report: ${sweep.name}`),
    sweep.description ? el('p', {}, sweep.description) : null,
    el('dl', { class: 'kv', id: 'report-source' },
      el('dt', {}, 'state'), el('dd', {}, `${sweep.state}: ${sweep.states}`),
      el('dt', {}, 'code version'), el('dd', {}, source.code_version || '—'),
      el('dt', {}, 'spec file'), el('dd', {}, source.spec_file || '—', ' (', el('a', { href: 'spec.yaml' }, 'as submitted'), ')'),
      el('dt', {}, 'reference variant'), el('dd', {}, source.reference || '—'),
      el('dt', {}, 'created'), el('dd', {}, source.created),
      el('dt', {}, 'finished'), el('dd', {}, source.finished),
      sweep.tags.length ? [el('dt', {}, 'tags'), el('dd', { id: 'report-tags' }, tagList(sweep.tags))] : null),
    data.notes.length ? [el('h2', {}, 'Notes'), el('ul', { id: 'notes' }, data.notes.map((n) =>
      el('li', {}, `${n.created}, on ${n.run_id ? `run ${n.run_id}` : 'the sweep'}: `, n.text)))] : null,
  ].flat().filter((n) => n);
}


function variantsTable(variants) {
  const heads = ['variant', 'description', 'differs from the reference', 'budget', 'params', 'activated', 'added', 'FLOPs/token'];
  return el('table', { id: 'variants' },
    el('thead', {}, el('tr', {}, heads.map((h, i) => el('th', { class: i >= 4 ? 'num' : '' }, h)))),
    el('tbody', {}, variants.map((v) => el('tr', {},
      el('td', {}, v.name), el('td', {}, v.description), el('td', {}, v.diff || '—'), el('td', {}, v.budget || '—'),
      el('td', { class: 'num', title: String(v.params_total) }, count(v.params_total)),
      el('td', { class: 'num', title: String(v.params_activated) }, count(v.params_activated)),
      el('td', { class: 'num', title: String(v.params_added) }, count(v.params_added, true)),
      el('td', { class: 'num' }, v.flops_per_token > 0 ? count(v.flops_per_token) : '—')))));
}

function runsTable(runs) {
  const heads = ['run', 'variant', 'seed', 'state', 'steps', 'val loss', 'spikes', 'reason', 'tags'];
  return el('table', { id: 'runs' },
    el('thead', {}, el('tr', {}, heads.map((h) => el('th', {}, h)))),
    el('tbody', {}, runs.map((r) => el('tr', { class: r.state === 'DIVERGED' ? 'diverged' : null },
      el('td', { class: 'num' }, r.id), el('td', {}, r.variant + (r.axes ? ` (${r.axes})` : '')), el('td', { class: 'num' }, r.seed),
      el('td', {}, el('span', { class: `state ${r.state}` }, r.state)), el('td', { class: 'num' }, `${r.steps_done}/${r.steps_total}`),
      el('td', { class: 'num' }, num(r.val_loss)), el('td', { class: 'num' }, r.spike_steps), el('td', {}, r.reason),
      el('td', {}, tagList(r.tags))))));
}

function renderReport(data) {
  const view = document.getElementById('view');
  const compare = comparisonTable(data.table, data.figures);
  const sections = figureSections(data.table, data.figures);
  view.replaceChildren(
    ...reportHeader(data),
    el('h2', {}, 'Comparison'),
    el('p', { class: 'muted' }, 'Means ± sample std over the SUCCEEDED seeds of each variant; diverged runs are counted, not averaged. Click a header to sort.'),
    compare.node,
    pairedSection(data.compare)?.section,
    tuneSection(data.tune)?.section,
    el('div', { id: 'figures' }, sections.map((s) => s.section)),
    el('h2', {}, 'Variants: budget solutions and parameters'), variantsTable(data.variants),
    el('h2', {}, 'Runs'), runsTable(data.runs),
    el('h2', {}, 'Spec'), el('pre', { class: 'config', id: 'spec' }, data.spec_yaml),
    el('h2', {}, 'Files'),
    el('ul', { id: 'files' }, el('li', {}, el('a', { href: 'report.md' }, 'report.md'), ': the same as markdown, with SVG figures'),
      data.files.map((f) => el('li', {}, el('a', { href: f }, f)))));
  sections.forEach((s) => s.draw());
  document.body.dataset.ready = String(sections.length);
}

try {
  renderReport(JSON.parse(document.getElementById('report-data').textContent));
} catch (err) {
  document.body.dataset.error = String(err && err.message ? err.message : err);
  document.getElementById('view').replaceChildren(el('div', { class: 'error-box', id: 'error' }, `This report could not be drawn: ${document.body.dataset.error}`));
}

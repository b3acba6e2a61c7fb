// #/compare/NAME : the `ablate table` comparison, sortable, mean ± std over seeds, and the sweep's
// figures (figures.js, the same as `ablate report` draws): training loss as mean ± std bands with
// spike markers, validation loss bars with error bars, M-Act and F-Attn per layer, gate-score
// histograms, PPL against evaluation length when measured. While the sweep is ACTIVE the page
// refreshes itself, and a variant with no finished run shows the latest evaluation of its running
// runs, marked interim, instead of dashes.
import { api } from '../api.js';
import { comparisonTable, figureSections } from '../figures.js';
import { el } from '../format.js';

const REFRESH_MS = 5000;

export async function render(view, ctx, name) {
  ctx.crumbs([[`#/sweep/${encodeURIComponent(name)}`, name], [null, 'compare']]);
  const path = `sweeps/${encodeURIComponent(name)}`;
  const load = () => Promise.all([api(`${path}/table`), api(`${path}/figures`)]);
  let [table, figures] = await load();
  const compare = comparisonTable(table, figures);
  const figureBox = el('div', { id: 'figures' });
  const drawFigures = () => {
    const sections = figureSections(table, figures);
    figureBox.replaceChildren(...sections.map((s) => s.section));
    sections.forEach((s) => s.draw());  // once in the page: each chart takes its width from its box
    figureBox.dataset.state = figures.state;
    figureBox.dataset.interim = figures.groups.filter((g) => g.interim).length;
  };
  view.replaceChildren(
    el('h1', {}, `Compare: ${name}`),
    el('p', { class: 'muted' }, 'Means ± sample std over the SUCCEEDED seeds of each variant; diverged runs are counted, not averaged. Click a header to sort.'),
    compare.node, figureBox);
  drawFigures();
  if (figures.state !== 'ACTIVE') return;
  ctx.every(REFRESH_MS, async () => {
    if (figures.state !== 'ACTIVE') return;  // the last refresh saw it end
    [table, figures] = await load();
    compare.update(table, figures);
    drawFigures();
  });
}

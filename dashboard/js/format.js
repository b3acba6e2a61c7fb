// Small formatting helpers shared by the pages.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else if (k === 'style') node.style.cssText = v;
    else node.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function num(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  if (Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0)) return v.toExponential(2);
  return Number(v).toFixed(digits);
}

export function count(n, sign = false) {
  if (n === null || n === undefined || Number.isNaN(n)) return '—';
  const s = sign && n > 0 ? '+' : '';
  const a = Math.abs(n);
  if (a >= 1e9) return `${s}${(n / 1e9).toFixed(2)}B`;
  if (a >= 1e6) return `${s}${(n / 1e6).toFixed(2)}M`;
  if (a >= 1e3) return `${s}${(n / 1e3).toFixed(1)}K`;
  return `${s}${n}`;
}

export function time(unix) {
  if (!unix) return '—';
  return new Date(unix * 1000).toLocaleString();
}

export function duration(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return '—';
  if (s <= 0) return 'done';
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function stateBadge(state) {
  return el('span', { class: `state ${state}` }, state);
}

// `ablate tag`'s tags, each a small outlined label.
export function tagList(tags) {
  return (tags || []).map((t) => el('span', { class: 'tag' }, t));
}

// A note (`ablate note`): when, on what, and its text.
export function noteItem(n) {
  const when = new Date(n.created_at * 1000).toISOString().replace('T', ' ').slice(0, 19);
  return el('li', {}, el('span', { class: 'muted' }, `${when} UTC, ${n.run_id ? `run ${n.run_id}` : 'the sweep'}: `), n.text);
}

// A stable colour per run (golden-angle hues), red reserved for diverged runs.
export function runColor(index) {
  const hue = (index * 137.508 + 200) % 360;
  const h = hue > 345 || hue < 15 ? (hue + 30) % 360 : hue;
  return `hsl(${h.toFixed(0)}, 62%, 46%)`;
}

export const DIVERGED_COLOR = '#d64541';

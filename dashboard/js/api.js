// The JSON API and the live stream, with the token kept for the tab's lifetime.
// The URL `ablate` prints carries ?token=...: it is moved to sessionStorage and out of the
// address bar, then sent as a bearer header (the stream, an EventSource, uses the query form).
const TOKEN_KEY = 'ablate.token';

export function adoptTokenFromUrl() {
  const params = new URLSearchParams(location.search);
  const token = params.get('token');
  if (token === null) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  params.delete('token');
  const query = params.toString();
  history.replaceState(null, '', location.pathname + (query ? `?${query}` : '') + location.hash);
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export class Unauthorized extends Error {
  constructor() {
    super('not authorized: open the URL ablate printed (it carries the token)');
    this.name = 'Unauthorized';
  }
}

export async function api(path, params = {}) {
  const url = new URL(`/api/${path}`, location.origin);
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  const res = await fetch(url, { headers: { Authorization: `Bearer ${token()}` } });
  if (res.status === 401) throw new Unauthorized();
  let body;
  try {
    body = await res.json();
  } catch {
    throw new Error(`${res.status} ${res.statusText}`);
  }
  if (!res.ok) throw new Error(body.error || `${res.status} ${res.statusText}`);
  return body;
}

// Opens the sweep's stream. `handlers` maps event names (hello, points, run, spike, event, sweep)
// to functions of the parsed data. Returns the EventSource (call close()).
export function openStream(sweep, handlers, onStatus = () => {}) {
  const url = new URL('/api/stream', location.origin);
  url.searchParams.set('sweep', sweep);
  url.searchParams.set('token', token());
  const source = new EventSource(url);
  for (const [name, fn] of Object.entries(handlers)) {
    source.addEventListener(name, (e) => fn(JSON.parse(e.data)));
  }
  source.onopen = () => onStatus(true);
  source.onerror = () => onStatus(false);
  return source;
}

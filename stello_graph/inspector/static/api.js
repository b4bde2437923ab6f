// Talking to the inspector's JSON API, and small DOM helpers shared by the views.

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// The secret of the URL `stello-graph inspect` printed (?token=...): writes send it (and reads,
// when the server is off loopback). Kept for this tab, and taken out of the address bar.
export const token = (() => {
  const url = new URL(location.href);
  const given = url.searchParams.get("token");
  if (given) {
    sessionStorage.setItem("stello-token", given);
    url.searchParams.delete("token");
    history.replaceState(null, "", url);
  }
  return sessionStorage.getItem("stello-token");
})();

async function request(method, path, body) {
  const init = { method, headers: { Accept: "application/json" } };
  if (token) init.headers["X-Stello-Token"] = token;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, data.error || response.statusText);
  return data;
}

export const api = {
  info: () => request("GET", "/api/info"),
  tree: () => request("GET", "/api/tree?compact=1"),
  // the id goes in the query: every id the library takes (`a/b`, `..`) survives there
  session: (id) => request("GET", `/api/session?${new URLSearchParams({ id })}`),
  records: (id, offset = 0, limit = 1000) =>
    request("GET", `/api/session/records?${new URLSearchParams({ id, offset, limit })}`),
  context: (id) => request("GET", `/api/session/context?${new URLSearchParams({ id })}`),
  write: (id, action, body = {}, method = "POST") =>
    request(method, `/api/session/${action}?${new URLSearchParams({ id })}`, body),
  integrate: (mode) => request("POST", "/api/integrate", { mode }),
};

/** `el("div.a.b", {title: "x"}, child, "text")`: an element with classes, attributes, children
 * (arrays of children, nested to any depth, are flattened). */
export function el(spec, attrs = {}, ...children) {
  const [tag, ...classes] = spec.split(".");
  const node = document.createElement(tag || "div");
  if (classes.length) node.className = classes.join(" ");
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A label cut to `max` characters in the middle, so siblings with a common prefix differ. */
export function elide(label, max = 28) {
  const flat = (label || "").replace(/\s+/g, " ").trim() || "(no label)";
  if (flat.length <= max) return flat;
  const tail = Math.floor((max - 1) / 3);
  return flat.slice(0, max - 1 - tail).trimEnd() + "…" + flat.slice(flat.length - tail).trimStart();
}

export function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

export function toast(message, error = false) {
  const node = el(error ? "div.toast.err" : "div.toast", { role: "status" }, message);
  document.body.append(node);
  setTimeout(() => node.remove(), error ? 6000 : 2500);
}

export function time(iso) {
  const d = new Date(iso);
  return isNaN(d) ? "" : d.toLocaleTimeString([], { hour12: false });
}

// The inspector page: wires the star map, the session list, the session / context / events
// views and the live feed together. `document.body.dataset.ready` is set once the first
// render is done (tests and the benchmark wait for it).

import { api, el, toast } from "/static/api.js";
import { renderContext } from "/static/context.js";
import { Timeline } from "/static/events.js";
import { SessionList } from "/static/list.js";
import { renderSession } from "/static/session.js";
import { StarMap } from "/static/starmap.js";
import { Tree } from "/static/tree.js";

const $ = (id) => document.getElementById(id);
const state = { tree: null, collapsed: new Set(), selected: null, tab: "session", query: "", info: null, events: 0 };

const map = new StarMap($("map"), $("tip"), { onSelect: (id) => select(id), onToggle: (id) => toggle(id) });
const list = new SessionList($("list"), { onSelect: (id) => select(id, { center: true }), onToggle: (id) => toggle(id) });
const timeline = new Timeline($("tab-events"), {
  tree: () => state.tree, select: (id) => select(id, { center: true }), selected: () => state.selected,
  onEvent: (event) => onEvent(event), onLive: (on) => { $("live").className = on ? "live on" : "live off"; },
});

function listItems() {
  if (!state.query) return state.tree.visible(state.collapsed);
  return state.tree.search(state.query);
}

function refreshList() {
  list.setItems(listItems(), state.collapsed, Boolean(state.query));
  list.select(state.selected);
  const t = state.tree;
  const archived = t.nodes.filter((n) => n.status === "archived").length;
  const stale = t.nodes.filter((n) => n.role !== "main" && n.status !== "archived" && n.stale_turns > 0).length;
  const failing = t.nodes.reduce((s, n) => s + n.failures, 0) + t.treeFailures;
  const found = state.query ? ` · ${listItems().length} match(es)` : "";
  $("counts").textContent = `${t.count} sessions · ${archived} archived · ${stale} stale L2 · ${failing} failure(s)${found}`;
}

function toggle(id) {
  if (state.collapsed.has(id)) state.collapsed.delete(id); else state.collapsed.add(id);
  map.relayout();
  refreshList();
}

async function loadTree({ keepView = false } = {}) {
  state.tree = new Tree(await api.tree());
  for (const id of [...state.collapsed]) if (!state.tree.byId.has(id)) state.collapsed.delete(id);
  map.setTree(state.tree, state.collapsed, { keepView });
  refreshList();
  if (state.query) map.setMatches(state.tree.search(state.query).map((n) => n.id));
}

function setHash() {
  const params = new URLSearchParams();
  if (state.selected) params.set("s", state.selected);
  if (state.tab !== "session") params.set("tab", state.tab);
  history.replaceState(null, "", `#${params}`);
}

async function select(id, { center = false } = {}) {
  if (!state.tree.byId.has(id)) { toast(`No session ${id} in this tree.`, true); return; }
  state.selected = id;
  for (const a of state.tree.ancestors(id)) if (state.collapsed.delete(a.id)) map.relayout();
  map.select(id);
  if (center) map.reveal(id);
  list.select(id);
  list.reveal(id);
  setHash();
  await showTab(state.tab);
}

async function showTab(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll(".tabs button")) b.classList.toggle("on", b.dataset.tab === tab);
  for (const name of ["session", "context", "events"]) $(`tab-${name}`).hidden = name !== tab;
  setHash();
  const root = $(`tab-${tab}`);
  if (tab === "events") { timeline.render(); return; }
  if (!state.selected) {
    root.replaceChildren(el("div.empty", {}, "Select a session on the map or in the list."));
    return;
  }
  try {
    if (tab === "session") await renderSession(root, state.selected, context);
    else await renderContext(root, state.selected);
    document.body.dataset.view = `${tab}:${state.selected}`;
  } catch (error) {
    root.replaceChildren(el("div.empty", {}, `Could not load it: ${error.message}`));
  }
}

let treeTimer = null;
function onEvent(event) {
  state.events += 1;
  $("event-count").textContent = String(state.events);
  clearTimeout(treeTimer);
  treeTimer = setTimeout(async () => {
    await loadTree({ keepView: true });
    if (state.selected && state.tab !== "events" && state.tree.byId.has(state.selected)) await showTab(state.tab);
  }, 400);
}

// -- writes (--write) ---------------------------------------------------------------------------
const context = {
  get write() { return state.info && state.info.write; },
  select: (id) => select(id, { center: true }),
  async write_(id, action, body = {}, method = "POST") {
    try {
      const out = await api.write(id, action, body, method);
      toast(`${action}: done`);
      await loadTree({ keepView: true });
      if (action === "fork" && out.node) await select(out.node.id, { center: true });
      else await showTab(state.tab);
    } catch (error) { toast(`${action}: ${error.message}`, true); }
  },
  dialog(title, fields, submit) {
    const inputs = {};
    const form = el("form", { method: "dialog" }, el("h2", {}, title), fields.map((f) => {
      const input = f.options ? el("select", { name: f.name }, f.options.map((o) => el("option", { value: o }, o)))
        : f.textarea ? el("textarea", { name: f.name }) : el("input", { name: f.name, type: f.type || "text" });
      if (f.value) input.value = f.value;
      inputs[f.name] = input;
      return [el("label", {}, f.label), input];
    }), el("div.row", {}, el("button", { value: "cancel", type: "button", onclick: () => dlg.close() }, "Cancel"), el("button", { value: "ok" }, "OK")));
    const dlg = el("dialog", {}, form);
    form.addEventListener("submit", () => {
      const values = Object.fromEntries(Object.entries(inputs).map(([k, v]) => [k, v.value.trim()]));
      submit(values);
    });
    dlg.addEventListener("close", () => dlg.remove());
    document.body.append(dlg);
    dlg.showModal();
  },
};

function globalActions() {
  if (!state.info.write) return;
  const integrate = (mode) => async () => {
    try { await api.integrate(mode); toast(`integrate (${mode}): done`); await loadTree({ keepView: true }); await showTab(state.tab); }
    catch (error) { toast(`integrate: ${error.message}`, true); }
  };
  $("global-actions").replaceChildren(
    el("button", { onclick: integrate("flat"), title: "main session reads every L2" }, "Integrate (flat)"),
    el("button", { onclick: integrate("tree"), title: "layer by layer, bottom-up" }, "Integrate (tree)"));
}

// -- start --------------------------------------------------------------------------------------
function bindControls() {
  $("zoom-in").onclick = () => map.zoom(1.4);
  $("zoom-out").onclick = () => map.zoom(1 / 1.4);
  $("zoom-fit").onclick = () => map.fit();
  for (const b of document.querySelectorAll(".tabs button")) b.onclick = () => showTab(b.dataset.tab);
  const search = $("search");
  search.addEventListener("input", () => {
    state.query = search.value;
    const found = state.tree.search(state.query);
    map.setMatches(found.length <= 2000 ? found.map((n) => n.id) : []);
    refreshList();
  });
  search.addEventListener("keydown", (e) => {
    if (e.key !== "Enter") return;
    const found = state.tree.search(state.query);
    if (found.length) select(found[0].id, { center: true });
  });
}

async function start() {
  state.info = await api.info();
  $("where").textContent = `${state.info.database || ""} · tree “${state.info.tree_id}”`;
  $("mode").textContent = state.info.write ? "read-write" : "read-only";
  if (state.info.write) $("mode").classList.add("write");
  bindControls();
  globalActions();
  await loadTree();
  const params = new URLSearchParams(location.hash.slice(1));
  state.tab = ["session", "context", "events"].includes(params.get("tab")) ? params.get("tab") : "session";
  const wanted = params.get("s");
  const first = wanted && state.tree.byId.has(wanted) ? wanted : null;
  if (first) await select(first, { center: true });
  else await showTab(state.tab);
  timeline.connect();
  timeline.render();
  map.onDrawn = () => { document.body.dataset.ready = "1"; map.onDrawn = null; };
  map.redraw();
}

window.stelloInspector = { map, list, state };  // for tests and the console

start().catch((error) => {
  document.body.dataset.ready = "error";
  $("tab-session").replaceChildren(el("div.empty", {}, `The inspector could not start: ${error.message}`));
});

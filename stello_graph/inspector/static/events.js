// The live timeline: server-sent events of the tree (`/api/events`), newest first, with
// filters by type and by session.

import { el, elide, time, token } from "/static/api.js";

const KEPT = 3000;
const SHOWN = 400;

export class Timeline {
  constructor(root, { tree, select, selected, onEvent, onLive }) {
    this.root = root;
    this.tree = tree;
    this.select = select;
    this.selected = selected;
    this.onEvent = onEvent;
    this.onLive = onLive;
    this.events = [];
    this.type = "";
    this.scope = "all";
    this.text = "";
    this._controls();
  }

  connect() {
    this.source = new EventSource(token ? `/api/events?${new URLSearchParams({ token })}` : "/api/events");
    this.source.addEventListener("open", () => this.onLive(true));
    this.source.addEventListener("error", () => this.onLive(false));
    this.source.addEventListener("stello", (message) => {
      const event = JSON.parse(message.data);
      this.events.push(event);
      if (this.events.length > KEPT) this.events.splice(0, this.events.length - KEPT);
      this.onEvent(event);
      this.scheduleRender();
    });
  }

  scheduleRender() {
    if (this.pending) return;
    this.pending = setTimeout(() => { this.pending = null; this.render(); }, 150);
  }

  _controls() {
    const types = ["session_added", "session_removed", "moved", "relabelled", "status_changed", "turns_changed",
      "l2_changed", "insight_set", "insight_cleared", "subtree_synthesis_changed", "synthesis_changed", "failure"];
    const typeSel = el("select", { "aria-label": "event type", onchange: (e) => { this.type = e.target.value; this.render(); } },
      el("option", { value: "" }, "all types"), types.map((t) => el("option", { value: t }, t)));
    const scopeSel = el("select", { "aria-label": "session", onchange: (e) => { this.scope = e.target.value; this.render(); } },
      el("option", { value: "all" }, "all sessions"), el("option", { value: "selected" }, "selected session"),
      el("option", { value: "failures" }, "failures only"));
    const text = el("input", { type: "text", placeholder: "label or id", "aria-label": "filter by session label",
      oninput: (e) => { this.text = e.target.value.toLowerCase(); this.render(); } });
    this.list = el("div.evlist");
    this.header = el("div.sub");
    this.root.replaceChildren(el("h2", {}, "Events"), this.header, el("div.filters", {}, typeSel, scopeSel, text), this.list);
  }

  _label(id) {
    const node = id && this.tree().byId.get(id);
    return node ? node.label || "(no label)" : id || "the tree";
  }

  render() {
    const sel = this.selected();
    const shown = [];
    for (let i = this.events.length - 1; i >= 0 && shown.length < SHOWN; i--) {
      const e = this.events[i];
      if (this.type && e.type !== this.type) continue;
      if (this.scope === "selected" && e.session_id !== sel) continue;
      if (this.scope === "failures" && e.type !== "failure") continue;
      if (this.text && !(`${this._label(e.session_id)} ${e.session_id || ""}`.toLowerCase().includes(this.text))) continue;
      shown.push(e);
    }
    this.header.textContent = `${this.events.length} event(s) since the page opened, from the stored tree; changes by any process appear here.`;
    this.list.replaceChildren(...(shown.length ? shown.map((e) => this._row(e)) : [el("div.empty", {}, "No events yet: change the tree (a turn, a fork, a consolidation…) and they appear here.")]));
  }

  _row(e) {
    const detail = {
      turns_changed: () => `${e.previous} → ${e.turns} turns`,
      status_changed: () => `${e.previous} → ${e.status}`,
      l2_changed: () => `covers records 1–${e.memory_through}`,
      relabelled: () => `was “${elide(e.previous, 30)}”`,
      moved: () => `under ${elide(this._label(e.parent_id), 30)}`,
      session_added: () => (e.parent_id ? `under ${elide(this._label(e.parent_id), 30)}` : ""),
      failure: () => `${e.kind}: ${e.error_type}: ${e.message}`,
      synthesis_changed: () => (e.synthesis ? elide(e.synthesis, 60) : ""),
    }[e.type];
    const who = e.session_id && this.tree().byId.get(e.session_id)
      ? el("a", { onclick: () => this.select(e.session_id) }, elide(this._label(e.session_id), 40))
      : el("span", {}, elide(e.label || this._label(e.session_id), 40));
    return el("div.ev", { "data-type": e.type }, el("span.at", {}, time(e.at)), el(`span.ty.${e.type}`, {}, e.type),
      el("span.who", {}, who, detail ? el("span.d", {}, "  " + detail()) : null));
  }
}

// The session list beside the map: virtualised (only the rows in view exist), so it stays
// fast at 10,000 sessions. Indented by depth; ▸/▾ collapses a subtree, like the map.

import { el, elide } from "/static/api.js";

const ROW = 28;

export class SessionList {
  constructor(container, { onSelect, onToggle }) {
    this.box = container;
    this.onSelect = onSelect;
    this.onToggle = onToggle;
    this.items = [];
    this.selected = null;
    this.spacer = el("div", { style: "height:0" });
    this.box.append(this.spacer);
    this.rows = new Map();
    this.box.addEventListener("scroll", () => this.render());
    new ResizeObserver(() => this.render()).observe(this.box);
  }

  /** `flat`: search results, shown without the tree's indentation. */
  setItems(items, collapsed, flat = false) {
    this.items = items;
    this.collapsed = collapsed;
    this.flat = flat;
    this.spacer.style.height = `${items.length * ROW}px`;
    for (const row of this.rows.values()) row.remove();
    this.rows.clear();
    this.render();
  }

  select(id) {
    this.selected = id;
    for (const [index, row] of this.rows) row.classList.toggle("sel", this.items[index].id === id);
  }

  reveal(id) {
    const index = this.items.findIndex((n) => n.id === id);
    if (index < 0) return;
    const top = index * ROW, view = this.box.clientHeight;
    if (top < this.box.scrollTop || top + ROW > this.box.scrollTop + view) this.box.scrollTop = top - view / 2;
    this.render();
  }

  render() {
    const first = Math.max(0, Math.floor(this.box.scrollTop / ROW) - 5);
    const last = Math.min(this.items.length, Math.ceil((this.box.scrollTop + this.box.clientHeight) / ROW) + 5);
    for (const [index, row] of this.rows) {
      if (index < first || index >= last) { row.remove(); this.rows.delete(index); }
    }
    for (let index = first; index < last; index++) {
      if (this.rows.has(index)) continue;
      const row = this._row(this.items[index], index);
      this.rows.set(index, row);
      this.box.append(row);
    }
  }

  _row(node, index) {
    const twist = node.kids.length ? (this.collapsed.has(node.id) ? "▸" : "▾") : "";
    const cls = ["vrow", node.status, node.id === this.selected ? "sel" : ""].join(" ").trim();
    const indent = 8 + (this.flat ? 0 : Math.min(node.depth, 8) * 12);
    const stale = node.role !== "main" && node.status !== "archived" && node.stale_turns
      ? el("span.stale", { title: `${node.stale_turns} turn(s) since the last consolidation` }, `stale ${node.stale_turns}`) : null;
    const row = el("div", {
      class: cls, role: "option", "data-id": node.id, title: node.label,
      style: `top:${index * ROW}px;padding-left:${indent}px`,
      onclick: () => this.onSelect(node.id),
    },
      el("span.twist", { onclick: (e) => { if (twist) { e.stopPropagation(); this.onToggle(node.id); } } }, twist),
      el("span.lbl", {}, elide(node.label || (node.role === "main" ? "Main Session" : node.id), 40)),
      stale,
      node.has_insight ? el("span", { title: "insight pending", style: "color:var(--insight)" }, "◆") : null,
      node.failures ? el("span.fail", { title: `${node.failures} background failure(s)` }, `⚠${node.failures}`) : null,
      node.damaged && node.damaged.length
        ? el("span.fail.damaged", { title: `stored data that does not decode: ${node.damaged.join(", ")}` }, "damaged") : null,
      el("span.num", { title: "turns" }, String(node.turns)),
    );
    return row;
  }
}

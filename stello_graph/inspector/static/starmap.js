// The interactive star map: the tree on a <canvas>, radial like `stello-graph tree --svg`.
// Pan (drag), zoom (wheel), select (click), collapse a subtree (double-click). Labels are
// placed greedily in screen space and never overlap: at a glance the nearest rings are
// named; zoom in and more appear; the hovered star always shows its full label in a tip.

import { elide, plural } from "/static/api.js";

const RING = 110;           // world units between two rings
const LABEL_FONT = 12;      // px
const MAX_LABELS = 350;     // per frame
const COLORS = {
  main: "#f2c14e", active: "#6ea8ff", archived: "#5c6378", edge: "rgba(120,140,200,0.28)",
  orbit: "rgba(80,96,150,0.35)", stale: "#f08a4b", insight: "#b48cff", fail: "#ff5d73",
  label: "#dfe5f5", select: "#ffffff", match: "#58d39a",
};

export class StarMap {
  constructor(canvas, tip, { onSelect, onToggle }) {
    this.canvas = canvas;
    this.tip = tip;
    this.onSelect = onSelect;
    this.onToggle = onToggle;
    this.ctx = canvas.getContext("2d");
    this.view = { scale: 1, x: 0, y: 0 };
    this.placed = [];
    this.selected = null;
    this.hovered = null;
    this.matches = new Set();
    this.dirty = true;
    this.widths = new Map();
    this._bind();
    new ResizeObserver(() => this._resize()).observe(canvas);
    this._resize();
  }

  // -- data ---------------------------------------------------------------------------------
  setTree(tree, collapsed, { keepView = false } = {}) {
    this.tree = tree;
    this.collapsed = collapsed;
    this._layout();
    if (!keepView || !this.touched) this.fit();  // follow a growing tree until moved by hand
    this.redraw();
  }

  relayout() { this._layout(); this.redraw(); }

  _layout() {
    const visible = this.tree.visible(this.collapsed);
    const leaves = new Map();
    for (let i = visible.length - 1; i >= 0; i--) {
      const node = visible[i];
      let sum = 0;
      if (!this.collapsed.has(node.id)) for (const kid of node.kids) sum += leaves.get(kid.id) || 0;
      leaves.set(node.id, sum || 1);
    }
    const most = visible.reduce((m, n) => Math.max(m, n.turns), 1);
    const placed = [];
    const sector = new Map();
    for (const root of this.tree.roots) sector.set(root.id, [-Math.PI / 2, 2 * Math.PI]);
    let maxDepth = 0;
    for (const node of visible) {
      const [start, width] = sector.get(node.id) || [0, 2 * Math.PI];
      const depth = node.depth;
      maxDepth = Math.max(maxDepth, depth);
      const angle = depth === 0 ? 0 : start + width / 2;
      const ring = depth * RING;
      const share = Math.sqrt(node.turns / most);
      let r = depth === 0 ? 12 + 6 * share : 3.5 + 7 * share;
      if (depth > 0) r = Math.max(1.2, Math.min(r, 0.45 * ring * Math.min(width, Math.PI), 0.35 * RING));
      node.x = ring * Math.cos(angle);
      node.y = ring * Math.sin(angle);
      node.r = r;
      node.hiddenKids = this.collapsed.has(node.id) ? this.tree.descendants(node) : 0;
      placed.push(node);
      if (!this.collapsed.has(node.id)) {
        const total = node.kids.reduce((s, k) => s + (leaves.get(k.id) || 1), 0);
        let at = start;
        for (const kid of node.kids) {
          const w = (width * (leaves.get(kid.id) || 1)) / total;
          sector.set(kid.id, [at, w]);
          at += w;
        }
      }
    }
    this.placed = placed;
    this.placedSet = new Set(placed);
    this.maxDepth = maxDepth;
    this._grid();
  }

  _grid() {
    this.cell = 24;
    this.buckets = new Map();
    for (const node of this.placed) {
      const key = `${Math.floor(node.x / this.cell)},${Math.floor(node.y / this.cell)}`;
      let bucket = this.buckets.get(key);
      if (!bucket) this.buckets.set(key, (bucket = []));
      bucket.push(node);
    }
  }

  // -- view -----------------------------------------------------------------------------------
  _resize() {
    const dpr = window.devicePixelRatio || 1;
    const { width, height } = this.canvas.getBoundingClientRect();
    this.width = width; this.height = height;
    this.canvas.width = Math.max(1, Math.round(width * dpr));
    this.canvas.height = Math.max(1, Math.round(height * dpr));
    this.dpr = dpr;
    this.redraw();
  }

  fit() {
    const extent = Math.max(RING * 0.6, (this.maxDepth || 0) * RING + 30);
    const room = Math.min(this.width || 600, this.height || 600) / 2 - 20;
    this.view.scale = Math.max(0.02, room / extent);
    this.view.x = (this.width || 600) / 2;
    this.view.y = (this.height || 600) / 2;
    this.redraw();
  }

  zoom(factor, sx = this.width / 2, sy = this.height / 2) {
    const v = this.view;
    this.touched = true;
    const next = Math.min(60, Math.max(0.02, v.scale * factor));
    v.x = sx - ((sx - v.x) * next) / v.scale;
    v.y = sy - ((sy - v.y) * next) / v.scale;
    v.scale = next;
    this._tip(null);
    this.redraw();
  }

  centerOn(id, minScale = 1.6) {
    const node = this.tree && this.tree.byId.get(id);
    if (!node || node.x === undefined) return;
    this.view.scale = Math.max(this.view.scale, minScale);
    this.view.x = this.width / 2 - node.x * this.view.scale;
    this.view.y = this.height / 2 - node.y * this.view.scale;
    this._tip(null);
    this.redraw();
  }

  /** Center on a star only when it is off the screen (or nearly). */
  reveal(id) {
    const node = this.tree && this.tree.byId.get(id);
    if (!node || !this.placedSet.has(node)) return;
    const [sx, sy] = this.toScreen(node);
    if (sx < 40 || sy < 40 || sx > this.width - 40 || sy > this.height - 60) this.centerOn(id, this.view.scale);
  }

  select(id) { this.selected = id; this.redraw(); }
  setMatches(ids) { this.matches = new Set(ids); this.redraw(); }

  redraw() {
    if (this.pending) return;
    this.pending = requestAnimationFrame(() => { this.pending = null; this.draw(); });
  }

  toScreen(node) {
    return [node.x * this.view.scale + this.view.x, node.y * this.view.scale + this.view.y];
  }

  // -- drawing ----------------------------------------------------------------------------------
  draw() {
    const { ctx, view, dpr } = this;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, this.width, this.height);
    if (!this.placed.length) { this.onDrawn && this.onDrawn(); return; }
    ctx.setTransform(dpr * view.scale, 0, 0, dpr * view.scale, dpr * view.x, dpr * view.y);
    const px = 1 / view.scale;
    ctx.lineWidth = px;
    ctx.setLineDash([3 * px, 5 * px]);
    ctx.strokeStyle = COLORS.orbit;
    for (let d = 1; d <= this.maxDepth; d++) {
      ctx.beginPath(); ctx.arc(0, 0, d * RING, 0, 2 * Math.PI); ctx.stroke();
    }
    ctx.setLineDash([]);
    ctx.strokeStyle = COLORS.edge;
    ctx.beginPath();
    for (const node of this.placed) {
      const parent = node.parent_id && this.tree.byId.get(node.parent_id);
      if (parent && parent.x !== undefined) { ctx.moveTo(parent.x, parent.y); ctx.lineTo(node.x, node.y); }
    }
    ctx.stroke();
    for (const [kind, test] of [
      ["archived", (n) => n.status === "archived"],
      ["active", (n) => n.status !== "archived" && n.role !== "main"],
      ["main", (n) => n.role === "main"],
    ]) {
      ctx.fillStyle = COLORS[kind];
      ctx.beginPath();
      for (const n of this.placed) {
        if (!test(n)) continue;
        const r = this.radius(n);
        ctx.moveTo(n.x + r, n.y); ctx.arc(n.x, n.y, r, 0, 2 * Math.PI);
      }
      ctx.fill();
    }
    this._marks(px);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this._labels();
    this.onDrawn && this.onDrawn();
  }

  /** A star's radius in world units: its size, kept between 1.3 and 16 (main: 22) pixels. */
  radius(n) {
    const px = 1 / this.view.scale;
    const least = n.depth === 0 ? 6 : n.depth === 1 ? 2.5 : 1.3;  // the sun and its ring stand out
    return Math.min(Math.max(n.r, least * px), (n.depth === 0 ? 22 : 14) * px);
  }

  /** Whether a star is drawn big enough on screen to carry marks and a label. */
  legible(n) { return n.depth <= 1 || n.r * this.view.scale >= 2.5; }

  _marks(px) {
    const { ctx } = this;
    ctx.lineWidth = 1.6 * px;
    ctx.strokeStyle = COLORS.stale;
    ctx.beginPath();
    for (const n of this.placed) {
      if (n.role === "main" || n.status === "archived" || !n.stale_turns || !this.legible(n)) continue;
      const r = this.radius(n) + 1.8 * px;
      ctx.moveTo(n.x + r, n.y); ctx.arc(n.x, n.y, r, 0, 2 * Math.PI);
    }
    ctx.stroke();
    for (const [key, colour, dx] of [["has_insight", COLORS.insight, -1], ["failures", COLORS.fail, 1]]) {
      ctx.fillStyle = colour;
      ctx.beginPath();
      for (const n of this.placed) {
        if (!n[key] || (!this.legible(n) && key !== "failures")) continue;
        const r = this.radius(n);
        const d = Math.max(2.2 * px, r * 0.4);
        const cx = n.x + dx * r * 0.8, cy = n.y - r * 0.8;
        ctx.moveTo(cx + d, cy); ctx.arc(cx, cy, d, 0, 2 * Math.PI);
      }
      ctx.fill();
    }
    for (const [ids, colour, width] of [[this.matches, COLORS.match, 2], [new Set([this.selected]), COLORS.select, 2.2]]) {
      ctx.strokeStyle = colour; ctx.lineWidth = width * px;
      ctx.beginPath();
      for (const id of ids) {
        const n = id && this.tree.byId.get(id);
        if (!n || !this.placedSet.has(n)) continue;
        const r = this.radius(n) + 4 * px;
        ctx.moveTo(n.x + r, n.y); ctx.arc(n.x, n.y, r, 0, 2 * Math.PI);
      }
      ctx.stroke();
    }
    ctx.fillStyle = COLORS.label;
    ctx.font = `${10 * px}px system-ui, sans-serif`;
    for (const n of this.placed) {
      if (n.hiddenKids) ctx.fillText(`+${n.hiddenKids}`, n.x + this.radius(n) + 3 * px, n.y + 14 * px);
    }
  }

  _width(text) {
    let w = this.widths.get(text);
    if (w === undefined) { w = this.ctx.measureText(text).width; this.widths.set(text, w); }
    return w;
  }

  /** Greedy, in screen space: the most important visible stars first; a label is drawn only
   * where it overlaps no label drawn before it (a grid of the placed boxes keeps it fast). */
  _labels() {
    const { ctx } = this;
    ctx.font = `${LABEL_FONT}px system-ui, sans-serif`;
    ctx.textBaseline = "middle";
    const W = this.width, H = this.height;
    const onScreen = [];
    for (const n of this.placed) {
      const [sx, sy] = this.toScreen(n);
      if (sx < -50 || sy < -20 || sx > W + 50 || sy > H + 20) continue;
      const pinned = n.id === this.selected || n.id === this.hovered || this.matches.has(n.id);
      if (!pinned && !this.legible(n)) continue;  // zoom in to name the small ones
      onScreen.push([n, sx, sy]);
    }
    const first = (n) => (n.id === this.selected || n.id === this.hovered ? 0 : this.matches.has(n.id) ? 1 : 2);
    onScreen.sort((a, b) => first(a[0]) - first(b[0]) || a[0].depth - b[0].depth || b[0].turns - a[0].turns);
    const cell = 80, grid = new Map();
    const boxes = [];
    const hits = (box) => {
      for (let gx = Math.floor(box[0] / cell); gx <= Math.floor(box[2] / cell); gx++)
        for (let gy = Math.floor(box[1] / cell); gy <= Math.floor(box[3] / cell); gy++)
          for (const o of grid.get(`${gx},${gy}`) || [])
            if (box[0] < o[2] && o[0] < box[2] && box[1] < o[3] && o[1] < box[3]) return true;
      return false;
    };
    const add = (box) => {
      for (let gx = Math.floor(box[0] / cell); gx <= Math.floor(box[2] / cell); gx++)
        for (let gy = Math.floor(box[1] / cell); gy <= Math.floor(box[3] / cell); gy++) {
          const key = `${gx},${gy}`;
          if (!grid.has(key)) grid.set(key, []);
          grid.get(key).push(box);
        }
    };
    const drawn = [];
    let tried = 0;
    for (const [n, sx, sy] of onScreen) {
      if (drawn.length >= MAX_LABELS || tried > 4 * MAX_LABELS) break;
      tried++;
      const text = elide(n.label || (n.role === "main" ? "Main Session" : n.id), 28);
      const w = this._width(text), h = LABEL_FONT + 3;
      const r = this.radius(n) * this.view.scale + 4;
      const fitsRight = sx + r + w + 2 <= W, fitsLeft = sx - r - w - 2 >= 0;
      const left = n.depth > 0 && fitsLeft && (sx < W / 2 || !fitsRight);
      const box = left ? [sx - r - w - 2, sy - h / 2, sx - r + 2, sy + h / 2] : [sx + r - 2, sy - h / 2, sx + r + w + 2, sy + h / 2];
      if (box[0] < 0 || box[2] > W || box[1] < 0 || box[3] > H || hits(box)) continue;
      add(box); boxes.push(box);
      drawn.push([n, text, box]);
    }
    for (const [n, text, box] of drawn) {
      ctx.fillStyle = "rgba(11,16,33,0.72)";
      ctx.fillRect(box[0], box[1], box[2] - box[0], box[3] - box[1]);
      ctx.fillStyle = n.status === "archived" ? "#8a8f98" : n.id === this.selected ? "#ffffff" : COLORS.label;
      ctx.fillText(text, box[0] + 2, (box[1] + box[3]) / 2 + 0.5);
    }
    this.labelBoxes = boxes;
    this.canvas.dataset.labels = String(drawn.length);
  }

  // -- interaction -------------------------------------------------------------------------------
  nodeAt(sx, sy) {
    const v = this.view;
    const wx = (sx - v.x) / v.scale, wy = (sy - v.y) / v.scale;
    const reach = Math.max(8 / v.scale, 1);
    let best = null, bestD = Infinity;
    const span = Math.ceil((reach + 25) / this.cell);
    const cx = Math.floor(wx / this.cell), cy = Math.floor(wy / this.cell);
    for (let gx = cx - span; gx <= cx + span; gx++)
      for (let gy = cy - span; gy <= cy + span; gy++)
        for (const n of this.buckets.get(`${gx},${gy}`) || []) {
          const d = Math.hypot(n.x - wx, n.y - wy);
          if (d <= Math.max(this.radius(n), reach) && d < bestD) { best = n; bestD = d; }
        }
    return best;
  }

  _tip(node, sx, sy) {
    if (!node) { this.tip.hidden = true; return; }
    const stale = node.role === "main" ? "" : node.has_l2 ? ` · L2 ${node.stale_turns ? plural(node.stale_turns, "turn") + " stale" : "fresh"}` : " · no L2";
    this.tip.replaceChildren();
    const title = document.createElement("div"); title.className = "t"; title.textContent = node.label || "(no label)";
    const meta = document.createElement("div"); meta.className = "m";
    meta.textContent = `${plural(node.turns, "turn")} · depth ${node.depth} · ${node.status}${stale}` +
      (node.failures ? ` · ${plural(node.failures, "failure")}` : "") + (node.has_insight ? " · insight pending" : "");
    const id = document.createElement("div"); id.className = "m mono"; id.textContent = node.id;
    this.tip.append(title, meta, id);
    this.tip.hidden = false;
    const x = Math.min(sx + 14, this.width - 330), y = Math.min(sy + 14, this.height - 80);
    this.tip.style.left = `${Math.max(4, x)}px`; this.tip.style.top = `${Math.max(4, y)}px`;
  }

  _bind() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const rect = c.getBoundingClientRect();
      this.zoom(Math.exp(-e.deltaY * 0.0015), e.clientX - rect.left, e.clientY - rect.top);
    }, { passive: false });
    c.addEventListener("pointerdown", (e) => {
      drag = { x: e.clientX, y: e.clientY, vx: this.view.x, vy: this.view.y, moved: false };
      c.setPointerCapture(e.pointerId);
    });
    c.addEventListener("pointermove", (e) => {
      const rect = c.getBoundingClientRect();
      const sx = e.clientX - rect.left, sy = e.clientY - rect.top;
      if (drag) {
        const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) { drag.moved = true; c.classList.add("drag"); }
        if (drag.moved) { this.touched = true; this.view.x = drag.vx + dx; this.view.y = drag.vy + dy; this.redraw(); this._tip(null); return; }
      }
      const node = this.nodeAt(sx, sy);
      const id = node ? node.id : null;
      if (id !== this.hovered) { this.hovered = id; this.redraw(); }
      this._tip(node, sx, sy);
    });
    c.addEventListener("pointerup", (e) => {
      const wasDrag = drag && drag.moved;
      drag = null; c.classList.remove("drag");
      if (wasDrag) return;
      const rect = c.getBoundingClientRect();
      const node = this.nodeAt(e.clientX - rect.left, e.clientY - rect.top);
      if (node) this.onSelect(node.id);
    });
    c.addEventListener("pointerleave", () => { this.hovered = null; this._tip(null); this.redraw(); });
    c.addEventListener("dblclick", (e) => {
      const rect = c.getBoundingClientRect();
      const node = this.nodeAt(e.clientX - rect.left, e.clientY - rect.top);
      if (node && node.kids.length) this.onToggle(node.id);
    });
  }
}

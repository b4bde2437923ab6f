// The tree as the page holds it: nodes by id, children, collapsed subtrees, search.

export class Tree {
  constructor(data) {
    const fields = data.fields;
    this.mainId = data.main_session_id;
    this.count = data.count;
    this.treeFailures = data.tree_failures;
    this.nodes = data.nodes.map((row) => {
      const node = {};
      for (let i = 0; i < fields.length; i++) node[fields[i]] = row[i];
      node.kids = [];
      return node;
    });
    this.byId = new Map(this.nodes.map((n) => [n.id, n]));
    this.roots = [];
    for (const node of this.nodes) {
      const parent = node.parent_id && this.byId.get(node.parent_id);
      if (parent) parent.kids.push(node); else this.roots.push(node);
    }
    for (const node of this.nodes) node.lower = node.label.toLowerCase();
  }

  /** Nodes in tree order, skipping the descendants of collapsed nodes. */
  visible(collapsed) {
    const out = [];
    const stack = [...this.roots].reverse();
    while (stack.length) {
      const node = stack.pop();
      out.push(node);
      if (!collapsed.has(node.id)) for (let i = node.kids.length - 1; i >= 0; i--) stack.push(node.kids[i]);
    }
    return out;
  }

  descendants(node) {
    let count = 0;
    const stack = [...node.kids];
    while (stack.length) { const n = stack.pop(); count++; stack.push(...n.kids); }
    return count;
  }

  ancestors(id) {
    const out = [];
    let node = this.byId.get(id);
    while (node && node.parent_id) { node = this.byId.get(node.parent_id); if (node) out.push(node); }
    return out;
  }

  search(query) {
    const q = query.trim().toLowerCase();
    if (!q) return [];
    return this.nodes.filter((n) => n.lower.includes(q) || n.id === query.trim());
  }
}

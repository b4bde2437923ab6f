// The session view: where it sits, its figures, L2 (and what it covers), the pending insight,
// the syntheses, its failures, and the transcript grouped by turn with tool calls as cards.

import { api, el, plural, time } from "/static/api.js";

function box(kind, text, meta) {
  if (!text) return el("div.none", {}, "none");
  return el(`div.box.${kind}`, {}, text, meta ? el("div.meta", {}, meta) : null);
}

function stat(label, value, cls = "") {
  return el(`span.stat${cls ? "." + cls : ""}`, {}, label, " ", el("b", {}, String(value)));
}

function json(value) {
  try { return JSON.stringify(value, null, 2); } catch { return String(value); }
}

function toolCard(call, result) {
  const failed = result && result.status === "error";
  return el("div.card", { "data-tool": call.name },
    el("div.head", {}, "⚙ ", el("span.nm", {}, call.name || "(unnamed tool)"), call.invalid ? "  (unparsable call)" : "",
      el("span", { style: "float:right;color:var(--dim)" }, call.id ? call.id.slice(0, 14) : "")),
    el("pre.args", {}, json(call.args)),
    result ? el(`pre.res${failed ? ".error" : ""}`, {}, result.content || "(empty result)")
           : el("pre.res", { style: "color:var(--dim)" }, "no result recorded"),
  );
}

/** Records grouped by user turn (a turn starts at a human message; turn 0 holds what came
 * before the first one, e.g. a fork's opening line). */
export function groupByTurn(records) {
  const turns = [];
  for (const record of records) {
    const last = turns[turns.length - 1];
    if (!last || last.turn !== record.turn) turns.push({ turn: record.turn, records: [record] });
    else last.records.push(record);
  }
  return turns;
}

function transcript(records, memoryThrough) {
  const results = new Map(records.filter((r) => r.role === "tool").map((r) => [r.tool_call_id, r]));
  const shown = new Set();
  const out = [];
  for (const group of groupByTurn(records)) {
    const end = group.records[group.records.length - 1].index;
    const covered = end <= memoryThrough;
    const head = el("div.turn-h", {}, el("span", {}, group.turn ? `Turn ${group.turn}` : "Before the first turn",
      el("span", { style: "margin-left:8px" }, `records ${group.records[0].index}–${end}`)));
    const body = [];
    for (const r of group.records) {
      if (r.role === "tool" && shown.has(r.tool_call_id)) continue;
      if (r.role === "tool") { body.push(el("div.msg.ai", {}, el("div.who", {}, `tool result · ${r.name || ""}`), r.content)); continue; }
      const who = { human: "user", ai: "assistant", system: "system" }[r.role] || r.role;
      if (r.content || !r.tool_calls) body.push(el(`div.msg.${r.role}`, { "data-index": r.index }, el("div.who", {}, `${who} · #${r.index}`), r.content || "(empty)"));
      for (const call of r.tool_calls || []) {
        const result = results.get(call.id);
        if (result) shown.add(call.id);
        body.push(toolCard(call, result));
      }
    }
    out.push(el(`div.turn${covered ? ".covered" : ""}`, { "data-turn": group.turn }, head, body));
  }
  return out;
}

export async function renderSession(root, id, ctx) {
  const [data, page] = await Promise.all([api.session(id), api.records(id)]);
  const records = page.records;
  let more = page.total - records.length;
  const meta = data.meta;
  const main = meta.role === "main";
  const actions = ctx.write ? sessionActions(id, data, ctx) : null;
  const crumbs = el("div.crumbs", {}, [...data.ancestors].reverse().flatMap((a) => [
    el("a", { onclick: () => ctx.select(a.id) }, a.label || (a.parent_id ? "(no label)" : "Main Session")), " › "]),
    meta.label || "(no label)");
  const staleCls = data.stale_turns ? "warn" : "";
  const l2meta = data.memory_through
    ? `covers records 1–${data.memory_through} of ${data.records} · ${data.stale_turns ? plural(data.stale_turns, "turn") + " since it was made" : "up to date"}`
    : "";
  const parts = [
    crumbs,
    el("h2", {}, meta.label || "(no label)"),
    el("div.sub", {}, el("code", {}, meta.id), ` · ${meta.role} · ${meta.status} · updated ${time(meta.updated_at)}`),
    data.lineage ? el("div.sub.lineage", {}, "forked from ",
      el("a", { onclick: () => ctx.select(data.lineage.forked_from) }, data.lineage.source_label || data.lineage.forked_from),
      data.lineage.forked_at_turn ? ` at turn ${data.lineage.forked_at_turn}` : "") : null,
    el("div.stats", {},
      stat("turns", data.turns), stat("records", data.records), stat("children", data.children.length),
      main ? null : stat("L2 stale by", plural(data.stale_turns, "turn"), staleCls),
      data.failures.length ? stat("failures", data.failures.length, "bad") : null,
      data.compression ? stat("compressed", `1–${data.compression.through}`) : null),
    actions,
    main ? [el("h3", {}, "Synthesis"), box("synth", data.synthesis)]
         : [el("h3", {}, "L2 (outward summary)"), box("l2", data.l2, l2meta),
            el("h3", {}, "Pending insight"), box("insight", data.insight, data.insight ? "shown once, at the next turn" : "")],
    data.subtree_synthesis ? [el("h3", {}, "Subtree synthesis"), box("synth", data.subtree_synthesis)] : null,
    el("h3", {}, "System prompt"), box("prompt", data.system_prompt),
    data.failures.length ? [el("h3", {}, "Background failures"),
      data.failures.map((f) => box("fail", `${f.kind}: ${f.error_type}: ${f.message}`, `${f.attempts} attempt(s) · ${time(f.at)}`))] : null,
    el("h3", {}, `Transcript · ${plural(page.total, "record")}`),
  ];
  const list = el("div.transcript", {}, records.length ? transcript(records, data.memory_through) : el("div.none", {}, "no records yet"));
  const loadMore = more > 0 ? el("button", { onclick: async () => {
    const next = await api.records(id, records.length);
    records.push(...next.records);
    more = next.total - records.length;
    list.replaceChildren(...transcript(records, data.memory_through));
    if (more <= 0) loadMore.remove(); else loadMore.textContent = `Load ${Math.min(more, 1000)} more`;
  } }, `Load ${Math.min(more, 1000)} more`) : null;
  root.replaceChildren(...parts.flat(2).filter(Boolean), list, loadMore || "");
  root.dataset.session = id;
}

function sessionActions(id, data, ctx) {
  const archived = data.meta.status === "archived";
  const main = data.meta.role === "main";
  const run = (label, fn) => el("button", { disabled: archived && label !== "Fork…" ? true : null, onclick: fn }, label);
  return el("div.actions", { style: "margin:6px 0" },
    run("Fork…", () => ctx.dialog("Fork", [
      { name: "label", label: "Label" },
      { name: "context", label: "Context", options: ["none", "inherit"] },
      // the user turns of the whole L3, inherited ones included: what at_turn counts
      data.fork_turns ? { name: "at_turn", label: `Start from turn (1–${data.fork_turns}; empty: see Context)`, type: "number" } : null,
      { name: "system_prompt", label: "System prompt (optional)", textarea: true },
    ].filter(Boolean), (v) => ctx.write_(id, "fork", clean(v)))),
    main ? null : run("Consolidate", () => ctx.write_(id, "consolidate")),
    main ? null : run("Archive", () => confirm(`Archive “${data.meta.label}”? It will refuse work.`) && ctx.write_(id, "archive")),
    main ? null : run("Edit insight…", () => ctx.dialog("Insight", [
      { name: "insight", label: "Insight (empty clears it)", textarea: true, value: data.insight || "" },
    ], (v) => ctx.write_(id, "insight", { insight: v.insight || null }, "PUT"))),
    run("Edit system prompt…", () => ctx.dialog("System prompt", [
      { name: "system_prompt", label: "System prompt (empty removes it)", textarea: true, value: data.system_prompt || "" },
    ], (v) => ctx.write_(id, "system_prompt", { system_prompt: v.system_prompt || null }, "PUT"))),
  );
}

function clean(values) {
  const out = { label: values.label };
  if (values.at_turn) out.at_turn = Number(values.at_turn);
  else out.context = values.context || "none";
  if (values.system_prompt) out.system_prompt = values.system_prompt;
  return out;
}

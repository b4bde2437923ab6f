// The context view: the exact prompt of the session's next turn, part by part, with the size
// of each (characters and ~tokens at 4 characters a token), like a context-window viewer.

import { api, el, plural } from "/static/api.js";

export const PART_COLORS = {
  "system prompt": "#6ea8ff", identity: "#58d39a", insight: "#b48cff", synthesis: "#f2c14e",
  "subtree synthesis": "#e0a84e", "compression summary": "#f08a4b", history: "#5c6a99",
};

function bar(sizes, total) {
  return el("div.bar", { role: "img", "aria-label": "context size by part" },
    sizes.map((s) => el("span", {
      title: `${s.kind}: ${s.chars} chars, ~${s.tokens} tokens`,
      style: `width:${total ? (100 * s.tokens) / total : 0}%;background:${PART_COLORS[s.kind] || "#888"}`,
    })));
}

function keys(sizes, total) {
  return el("div.keys", {}, sizes.flatMap((s) => [
    el("span.sw", { style: `background:${PART_COLORS[s.kind] || "#888"}` }),
    el("span", {}, s.kind),
    el("span.n", {}, `${s.chars.toLocaleString()} chars`),
    el("span.n", {}, `~${s.tokens.toLocaleString()} tok · ${total ? Math.round((100 * s.tokens) / total) : 0}%`),
  ]));
}

export async function renderContext(root, id) {
  const data = await api.context(id);
  const total = data.sizes.reduce((t, s) => t + s.tokens, 0);
  const system = data.messages.find((m) => m.role === "system");
  const history = data.messages.filter((m) => m.role !== "system");
  const notes = [];
  if (data.archived) notes.push(el("div.note.warn", {}, "This session is archived: it refuses new turns. Shown is the prompt it had."));
  if (data.compression) notes.push(el("div.note", {}, `Records 1–${data.compression.through} are replaced by the compression summary; the history starts at record ${data.history_from}.`));
  if (data.dropped_records) notes.push(el("div.note.warn", {}, `${plural(data.dropped_records, "record")} left out (incomplete tool-call groups).`));
  if (data.compression_due) notes.push(el("div.note", {}, data.compression_due.due
    ? `The next turn would compress: the summary would cover records 1–${data.compression_due.through} (window ${data.compression_due.context_window} tokens).`
    : `Fits the context window (${data.compression_due.context_window} tokens): no compression next turn.`));
  root.replaceChildren(
    el("h2", {}, "Context of the next turn"),
    el("div.sub", {}, `${plural(data.messages.length, "message")} · ~${total.toLocaleString()} tokens before the new user message · read only, nothing is compressed or consumed`),
    bar(data.sizes, total), keys(data.sizes, total), ...notes,
    el("h3", {}, "System message"),
    system ? el("div.parts", {}, system.parts.map((p) => el("div.part", { "data-kind": p.kind, style: `border-left:3px solid ${PART_COLORS[p.kind]}` },
      el("div.ph", {}, el("span.k", {}, p.kind), el("span", {}, `${p.chars} chars · ~${p.tokens} tok`)),
      el("pre", {}, p.text)))) : el("div.none", {}, "no system message"),
    el("h3", {}, `History · ${plural(history.length, "message")}`),
    history.length ? el("div.history", {}, history.map((m) => el("div.ctx-msg", { "data-role": m.role },
      el("span.r", {}, { human: "user", ai: "asst" }[m.role] || m.role),
      el("span.c", {}, m.content || "", (m.tool_calls || []).map((c) => el("div.mono", { style: "color:var(--ok)" }, `→ ${c.name}(${JSON.stringify(c.args)})`))),
      el("span.n", {}, `~${m.tokens}`)))) : el("div.none", {}, "no history"),
    el("div.note", {}, "Then comes the new user message."),
  );
  root.dataset.session = id;
}

"""Other sites' pages against a `--write` inspector, in a real headless Chromium: a page of
another origin tries every write by form (`enctype="text/plain"` included) and by `fetch`
(`mode: "no-cors"` included) and changes nothing; a DNS-rebinding page reads nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stello_graph.export import export_tree
from tests.browser.conftest import REBOUND, Server, other_site

pytestmark = pytest.mark.browser

TIMEOUT = 30_000

ATTACK = """<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head><body>
<script type="module">
const TARGET = __TARGET__;  // the inspector's root, another origin than this page's
const SID = __SID__;
const writes = [
  [`/api/session/fork?id=${encodeURIComponent(SID)}`, { label: "Cross-site", system_prompt: "x" }],
  [`/api/session/consolidate?id=${encodeURIComponent(SID)}`, null],
  [`/api/session/archive?id=${encodeURIComponent(SID)}`, null],
  [`/api/session/insight?id=${encodeURIComponent(SID)}`, { insight: "planted" }],
  [`/api/session/system_prompt?id=${encodeURIComponent(SID)}`, { system_prompt: "replaced" }],
  ["/api/integrate", null],
];
const done = [];

// A form posts into a frame of its own; its load (a page of the other origin, whose address
// this page may not read) says the answer came.
function submit(path, body, enctype) {
  return new Promise((resolve) => {
    const frame = document.createElement("iframe");
    frame.name = `frame${done.length}`;
    frame.addEventListener("load", () => {
      try { frame.contentWindow.location.href; } catch { resolve(); }  // cross-origin: loaded
    });
    document.body.append(frame);
    const form = document.createElement("form");
    Object.assign(form, { method: "POST", action: TARGET + path, enctype, target: frame.name });
    if (body) {  // text/plain sends `name=value`: split the JSON inside its last string
      const json = JSON.stringify(body);
      const cut = json.lastIndexOf(':"') + 2;
      const input = document.createElement("input");
      Object.assign(input, { type: "hidden", name: json.slice(0, cut), value: json.slice(cut) });
      form.append(input);
    }
    document.body.append(form);
    form.submit();
    done.push(`form ${enctype} ${path}`);
  });
}

async function send(path, init) {
  try {
    const response = await fetch(TARGET + path, init);
    done.push(`fetch ${init.mode || "cors"} ${init.method} ${path}: ${response.type}`);
  } catch {
    done.push(`fetch ${init.mode || "cors"} ${init.method} ${path}: refused`);
  }
}

for (const [path, body] of writes) {
  for (const enctype of ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
    await submit(path, body, enctype);
  const json = JSON.stringify(body || {});
  const blob = new Blob([json], { type: "application/json" });
  const guessed = { "Content-Type": "application/json", "X-Stello-Token": "guess" };
  await send(path, { method: "POST", mode: "no-cors", body: json });
  await send(path, { method: "POST", mode: "no-cors", body: blob });
  await send(path, { method: "POST", mode: "no-cors", body: json, headers: guessed });
  await send(path, { method: "POST", body: json, headers: guessed });
  await send(path, { method: "PUT", mode: "no-cors", body: json });
  await send(path, { method: "PUT", body: json, headers: { "Content-Type": "application/json" } });
}
let read;
try { read = await (await fetch(TARGET + "/api/tree")).text(); } catch { read = "refused"; }
window.attack = { done, read };
document.body.dataset.done = "1";
</script>
</body></html>
"""


def _pricing(server: Server) -> str:
    return next(n.id for n in server.storage.get_tree() if n.label == "Pricing")


def test_another_sites_page_cannot_write(browser: Any, write_server: Server) -> None:
    before = export_tree(write_server.storage, records=True)
    target = write_server.url.rstrip("/")
    html = ATTACK.replace("__TARGET__", json.dumps(target))
    html = html.replace("__SID__", json.dumps(_pricing(write_server)))
    page = browser.new_page()  # no check of its console: refused requests log errors there
    try:
        with other_site(html) as url:
            page.goto(url)
            page.wait_for_selector("body[data-done='1']", state="attached", timeout=TIMEOUT)
            attack = page.evaluate("window.attack")
    finally:
        page.close()
    assert len(attack["done"]) == 6 * (3 + 6), attack["done"]
    assert attack["read"] == "refused"  # nor can it read the answer of its own request
    assert export_tree(write_server.storage, records=True) == before
    writes = [(method, path, status) for method, path, status in write_server.seen
              if method in ("POST", "PUT")]  # fmt: skip
    # the forms and the no-cors fetches reached the server, which refused each of them
    assert {path for _, path, _ in writes} == {
        *(f"/api/session/{action}" for action in
          ("fork", "consolidate", "archive", "insight", "system_prompt")),
        "/api/integrate",
    }  # fmt: skip
    assert len(writes) == 6 * (3 + 3)
    assert {status for _, _, status in writes} == {403}, writes


def test_a_rebinding_sites_page_reads_nothing(browser: Any, write_server: Server) -> None:
    """A site whose name its DNS points at 127.0.0.1 (here: the browser's resolver rule):
    the page it serves from there is same-origin with what it asks, but the server refuses
    its `Host`."""
    port = write_server.url.rstrip("/").rsplit(":", 1)[1]
    page = browser.new_page()
    try:
        response = page.goto(f"http://{REBOUND}:{port}/")
        assert response is not None and response.status == 421
        asked = page.evaluate("fetch('/api/tree').then(async (r) => [r.status, await r.text()])")
    finally:
        page.close()
    assert asked[0] == 421 and "Pricing" not in asked[1]
    assert ("GET", "/api/tree", 421) in write_server.seen

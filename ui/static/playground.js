// The playground: check the spec as it is typed, run the question through the
// server's own streaming chat endpoint (fetch + SSE parsing), show the strategy's
// steps (reasoning_content) and the answer as they arrive, then offer the trace.
// Model output is untrusted: it is only ever set as text (textContent, value).
"use strict";
(() => {
  const byId = (id) => document.getElementById(id);
  const form = byId("play");
  if (!form) return;
  const model = form.dataset.model;
  const fallback = form.dataset.default;
  let controller = null;
  let checkSeq = 0;
  let checkTimer = null;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  // -- the spec, checked as it is typed ----------------------------------------------
  const calls = (n) => `${n} call${n === 1 ? "" : "s"}`;

  function specLabel(node) {
    const params = Object.entries(node.params).map(([k, v]) => `${k}=${JSON.stringify(v)}`);
    return params.length ? `${node.name}(${params.join(", ")})` : node.name;
  }

  function specTree(node) {
    const li = el("li");
    li.append(el("code", specLabel(node)), el("span", ` ≤ ${calls(node.calls)}`, "muted"));
    if (node.inner.length) {
      const ul = el("ul");
      ul.append(...node.inner.map(specTree));
      li.append(ul);
    }
    return li;
  }

  function showCheck(c) {
    const box = byId("spec-check");
    if (!c.ok) {
      const parts = [el("span", c.error.message, "bad")];
      if (c.suggestion) {
        const b = el("button", `did you mean ${c.suggestion.suggestion}?`, "suggest");
        b.type = "button";
        b.id = "suggestion";
        b.addEventListener("click", () => applySuggestion(c.suggestion));
        parts.push(b);
      }
      box.replaceChildren(...parts);
      return;
    }
    const head = el("div");
    head.append(el("span", "✓ ", "ok"), el("code", c.canonical),
                el("span", ` · worst case ${calls(c.worst_case_calls)} per question`, "muted"));
    if (c.preset) head.append(el("span", ` · preset ${c.preset}`, "muted"));
    const tree = el("ul", undefined, "spec-tree");
    tree.append(specTree(c.graph));
    box.replaceChildren(head, tree);
  }

  function applySuggestion(s) {
    const spec = byId("spec");
    const wrong = new RegExp(`\\b${s.wrong.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}\\b`);
    spec.value = spec.value.replace(wrong, s.suggestion);
    checkSpec();
  }

  async function checkSpec() {
    const spec = byId("spec").value;
    const box = byId("spec-check");
    const seq = ++checkSeq;
    if (!spec.trim()) {
      box.replaceChildren(el("span", `no strategy: the server's default (${fallback})`, "muted"));
      return;
    }
    try {
      const r = await fetch(`/ui/api/spec?spec=${encodeURIComponent(spec)}`);
      const body = await r.json();
      if (seq !== checkSeq) return; // a newer check is on its way
      if (!r.ok) box.replaceChildren(el("span", body.error ? body.error.message : r.statusText, "bad"));
      else showCheck(body);
    } catch (e) {
      if (seq === checkSeq) box.replaceChildren(el("span", String(e), "bad"));
    }
  }

  byId("spec").addEventListener("input", () => {
    clearTimeout(checkTimer);
    checkTimer = setTimeout(checkSpec, 200);
  });
  byId("preset").addEventListener("change", () => {
    byId("spec").value = byId("preset").value;
    checkSpec();
  });

  // -- the run -------------------------------------------------------------------------
  function setStatus(text) { byId("status").textContent = text; }

  function reset() {
    byId("steps").replaceChildren();
    byId("step-count").textContent = "";
    byId("answer").textContent = "";
    byId("error").textContent = "";
    byId("usage").textContent = "";
    byId("trace-json").value = "";
    byId("open-trace").disabled = true;
  }

  function addStep(text) {
    const steps = byId("steps");
    steps.append(el("div", text.trim(), "step"));
    steps.scrollTop = steps.scrollHeight;
    byId("step-count").textContent = `(${steps.children.length})`;
  }

  function showUsage(usage, info) {
    const parts = [`${usage.total_tokens} tokens`];
    if (info) parts.unshift(`${info.calls} call${info.calls === 1 ? "" : "s"}`);
    if (info) parts.push(`${info.seconds} s`, info.strategy || "passthrough");
    byId("usage").textContent = parts.join(" · ");
    const trace = info && info.trace && info.trace[0];
    if (trace) {
      byId("trace-json").value = JSON.stringify(trace);
      byId("open-trace").disabled = false;
    }
  }

  function onChunk(chunk) {
    if (chunk.error) {
      byId("error").textContent = chunk.error.message;
      return;
    }
    for (const c of chunk.choices || []) {
      const d = c.delta || {};
      if (d.reasoning_content) addStep(d.reasoning_content);
      if (d.content) byId("answer").textContent += d.content;
    }
    if (chunk.usage) showUsage(chunk.usage, chunk.refinery);
  }

  // Server-sent events: "data: {json}" lines, events separated by a blank line,
  // ":" comment lines (keep-alives) ignored, "data: [DONE]" last.
  async function readEvents(body, onData) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          onData(JSON.parse(data));
        }
      }
    }
  }

  function request() {
    const spec = byId("spec").value.trim();
    const body = {
      model, stream: true, stream_options: { include_usage: true },
      messages: [{ role: "user", content: byId("question").value }],
      max_tokens: Number(byId("max-tokens").value),
      temperature: Number(byId("temperature").value),
      refinery: { trace: "full" },
    };
    if (spec) body.refinery.strategy = spec;
    return body;
  }

  async function run(ev) {
    ev.preventDefault();
    reset();
    controller = new AbortController();
    byId("run").disabled = true;
    byId("stop").disabled = false;
    const t0 = performance.now();
    const tick = setInterval(() => setStatus(`running… ${((performance.now() - t0) / 1000).toFixed(1)} s`), 200);
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(request()), signal: controller.signal,
      });
      if (!r.ok) {
        const err = await r.json().catch(() => null);
        byId("error").textContent = err && err.error ? err.error.message : `${r.status} ${r.statusText}`;
        setStatus("refused");
        return;
      }
      await readEvents(r.body, onChunk);
      setStatus(`done in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    } catch (e) {
      setStatus(e.name === "AbortError" ? "stopped" : "failed");
      if (e.name !== "AbortError") byId("error").textContent = String(e);
    } finally {
      clearInterval(tick);
      controller = null;
      byId("run").disabled = false;
      byId("stop").disabled = true;
    }
  }

  form.addEventListener("submit", run);
  byId("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  checkSpec();
})();

// The trace explorer's two buttons, and reading a trace file into the paste form.
// Data is only ever set as text (textContent, value), never parsed as HTML.
"use strict";
(() => {
  const byId = (id) => document.getElementById(id);
  const toggle = (open) => () => {
    for (const d of document.querySelectorAll("#tree details")) d.open = open;
  };
  const expand = byId("expand-all");
  if (expand) expand.addEventListener("click", toggle(true));
  const collapse = byId("collapse-all");
  if (collapse) collapse.addEventListener("click", toggle(false));

  const file = byId("trace-file");
  if (file) {
    file.addEventListener("change", async () => {
      const f = file.files && file.files[0];
      if (!f) return;
      const text = await f.text();
      // A traces.jsonl holds one trace a line: take the first non-empty one.
      const line = text.split("\n").find((l) => l.trim()) || "";
      byId("trace-text").value = line;
    });
  }
})();

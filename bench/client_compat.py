"""Do the clients people already run work against ``refinery serve``, unmodified?

Starts a real ``refinery serve`` (in-process engine) on loopback and points
two third-party clients at it, each from its own virtualenv (their pins
conflict with ours; ``make peers-clients`` builds it under
``$REFINERY_HOME/peers/clients``):

- **lm-evaluation-harness** ``local-chat-completions`` on a local GSM8K task
  (the first ``--limit`` test questions, a task yaml with ``dataset_path: json``
  and ``data_files``, no hub), once passthrough and once through a preset
  (``sc@MODEL``: a strategy spec with commas cannot go into lm-eval's
  comma-separated ``--model_args``; a preset name can). lm-eval sends
  ``seed: 1234`` with every request, so this is also the seeded path.
  Checks: exit 0, both filters' ``exact_match`` scored, no server error.
- **litellm** chat, a strategy through a preset, streaming with
  ``reasoning_content``, the Responses API (``litellm.responses``, whole, and
  streamed under a preset with its reasoning events), and an unknown model
  mapped to litellm's ``NotFoundError``.

Prints one line per check and ``N passed, N failed``; exits 1 on any failure.

    make peers-clients && python bench/client_compat.py [--limit 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from refinery.eval.datasets import gsm8k_file

HERE = Path(__file__).resolve().parent
HOME = Path(os.environ.get("REFINERY_HOME", Path.home() / ".cache" / "refinery"))
CLIENTS = HOME / "peers" / "clients" / "bin"
DATA = gsm8k_file("test").parent
MODEL = "smollm2-135m"

TASK_YAML = """task: gsm8k_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
generation_kwargs:
  until: ["Question:"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: 128
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metadata:
  version: 1.0
"""

LITELLM_SCRIPT = """
import json, sys, litellm
base, model = sys.argv[1], sys.argv[2]
kw = dict(api_base=base, api_key="none")
msgs = [{"role": "user", "content": "What is 3 + 4? Answer briefly."}]
out = {}
r = litellm.completion(model="openai/" + model, messages=msgs, max_tokens=32, **kw)
out["chat"] = r.choices[0].message.content
r = litellm.completion(model="openai/sc@" + model, messages=msgs, max_tokens=32, **kw)
out["preset"] = r.choices[0].message.content
content, reasoning = "", ""
for chunk in litellm.completion(model="openai/critique_refine@" + model, messages=msgs,
                                max_tokens=32, stream=True, **kw):
    d = chunk.choices[0].delta
    content += d.content or ""
    reasoning += getattr(d, "reasoning_content", None) or ""
out["stream_content"], out["stream_reasoning"] = content, reasoning
r = litellm.responses(model="openai/" + model, input=msgs[0]["content"],
                      max_output_tokens=32, **kw)
out["responses"] = "".join(c.text for item in r.output if item.type == "message"
                           for c in item.content)
kinds = []
for ev in litellm.responses(model="openai/sc@" + model, input=msgs[0]["content"],
                            max_output_tokens=32, stream=True, **kw):
    kind = getattr(ev, "type", "")  # litellm gives an Enum whose str() is its name
    kinds.append(str(getattr(kind, "value", kind)))
out["responses_stream"] = kinds
try:
    litellm.completion(model="openai/nope", messages=msgs, max_tokens=4, **kw)
    out["error"] = "none"
except litellm.NotFoundError as exc:
    out["error"] = "NotFoundError"
print("RESULT " + json.dumps(out))
"""


def start_server(port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "refinery.cli", "serve", "--port", str(port), "--model", MODEL]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"refinery serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise RuntimeError("refinery serve did not become healthy in 300 s")


def task_dir(tmp: Path, limit: int) -> Path:
    rows = (DATA / "test.jsonl").read_text().splitlines()[:limit]
    data = tmp / "gsm8k_local.jsonl"
    data.write_text("\n".join(rows) + "\n")
    tasks = tmp / "tasks"
    tasks.mkdir()
    (tasks / "gsm8k_local.yaml").write_text(TASK_YAML.format(data=data))
    return tasks


def run_lm_eval(port: int, model: str, tasks: Path, out: Path, limit: int) -> dict:
    """One lm-eval run; its per-filter exact_match scores (raises on a failed run)."""
    args = (f"model={model},base_url=http://127.0.0.1:{port}/v1/chat/completions,"
            "num_concurrent=4,max_retries=1,tokenized_requests=False")
    cmd = [str(CLIENTS / "lm_eval"), "--model", "local-chat-completions", "--model_args", args,
           "--tasks", "gsm8k_local", "--include_path", str(tasks), "--apply_chat_template",
           "--limit", str(limit), "--output_path", str(out)]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"lm_eval exited {proc.returncode}: {proc.stderr[-3000:]}")
    [found] = list(out.rglob("results_*.json"))
    scores = json.loads(found.read_text())["results"]["gsm8k_local"]
    return {k: v for k, v in scores.items() if k.startswith("exact_match,")}


def run_litellm(port: int) -> dict:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([str(CLIENTS / "python"), "-c", LITELLM_SCRIPT,
                           f"http://127.0.0.1:{port}/v1", MODEL],
                          capture_output=True, text=True, timeout=1200, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"litellm script failed: {proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def server_errors(log: Path) -> int:
    """Responses with a 5xx status in uvicorn's access log."""
    return sum(1 for ln in log.read_text(errors="replace").splitlines()
               if '" 5' in ln and "HTTP/1.1" in ln)


def checks(port: int, tmp: Path, limit: int) -> list[tuple[str, bool, str]]:
    tasks = task_dir(tmp, limit)
    out: list[tuple[str, bool, str]] = []
    for label, model in (("passthrough", MODEL), ("preset sc", f"sc@{MODEL}")):
        scores = run_lm_eval(port, model, tasks, tmp / label.replace(" ", "-"), limit)
        ok = len(scores) == 2 and all(isinstance(v, float) for v in scores.values())
        out.append((f"lm-eval {label} (seed 1234)", ok, json.dumps(scores)))
    got = run_litellm(port)
    out += [("litellm chat", bool(got["chat"]), repr(got["chat"][:60])),
            ("litellm preset", bool(got["preset"]), repr(got["preset"][:60])),
            ("litellm stream with reasoning_content",
             bool(got["stream_content"]) and bool(got["stream_reasoning"]),
             f"{len(got['stream_content'])} content chars, "
             f"{len(got['stream_reasoning'])} reasoning chars"),
            ("litellm responses", bool(got["responses"]), repr(got["responses"][:60])),
            ("litellm responses stream with reasoning",
             any("reasoning_summary_text.delta" in k for k in got["responses_stream"])
             and got["responses_stream"][-1] in ("response.completed", "response.incomplete"),
             f"{len(got['responses_stream'])} events"),
            ("litellm error mapping", got["error"] == "NotFoundError", got["error"])]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=8, help="GSM8K questions per lm-eval run")
    ap.add_argument("--port", type=int, default=8765)
    a = ap.parse_args()
    if not (CLIENTS / "lm_eval").exists():
        print(f"skipped: no client virtualenv at {CLIENTS.parent} (`make peers-clients`)")
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        log = tmp / "serve.log"
        server = start_server(a.port, log)
        try:
            results = checks(a.port, tmp, a.limit)
        finally:
            server.terminate()
            server.wait(60)
        errors = server_errors(log)
    results.append(("no 5xx in the server's log", errors == 0, f"{errors} responses"))
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    failed = sum(not ok for _, ok, _ in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()

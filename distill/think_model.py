"""``smollm2-135m-think``: the embedded model taught to think and to call tools natively.

A small thinking model for tests of reasoning parsers and native tool calls on CPU,
built once by refinery's own trainer (:func:`refinery.distill.train.train`) and cached
like the embedded model (``refinery model-path smollm2-135m-think`` builds it):

1. the embedded checkpoint gains the tokens ``<think>``, ``</think>``, ``<tool_call>``,
   ``</tool_call>`` (one id each, as vLLM's ``deepseek_r1``/``qwen3`` reasoning parsers
   and ``hermes`` tool parser look them up; not *special*, so detokenizing keeps them
   in the text the parsers read) and a chat template that renders ``tools`` (Hermes /
   Qwen2.5 style), tool turns and an assistant turn's ``reasoning``;
2. rows in think form: ``arith`` train problems with their reference solution as the
   thinking and ``The answer is \\boxed{N}.`` after it, and tool tasks (timers,
   translation, share prices, flights: none of ``bench/tool_calls.py``'s tools) answered
   by one ``<tool_call>{...}</tool_call>``;
3. a LoRA SFT of a few minutes on them, the new tokens' embedding rows trained too
   (SmolLM2 ties its output layer to them; peft trains the tied rows as one), merged.

The :class:`ThinkRecipe` (seeded) is saved as ``refinery_recipe.json`` beside the
trainer's own record.

Example:
    >>> rows = arith_think_rows(2)
    >>> rows[0].messages[-1].reasoning
    'Emma starts with 8.\\n8 - 2 = 6.'
    >>> rows[0].messages[-1].content
    'The answer is \\\\boxed{6}.'
    >>> path = ensure_think_model()  # doctest: +SKIP
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from refinery.distill.gold_fallback import arith_solution
from refinery.distill.schema import ChatMessage, MessagesRow, Provenance, write_rows
from refinery.engine.models import BUILT_MODELS, BuiltModel, cached_model_dir, resolve_model

__all__ = ["CHAT_TEMPLATE", "RECIPE_FILE", "THINK_MODEL", "THINK_TOKENS", "ThinkRecipe",
           "arith_think_rows", "build_think_model", "ensure_think_model", "tool_call_text",
           "tool_rows", "tools_system_prompt"]

THINK_MODEL = "smollm2-135m-think"
THINK_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
RECIPE_FILE = "refinery_recipe.json"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_TOOLS_HEAD = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user "
               "query.\n\nYou are provided with function signatures within <tools></tools> "
               "XML tags:\n<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name "
               "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
               '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

# The system turn (with the tools after it), then the turns; an assistant turn's
# reasoning goes first in think tags, its calls after its content.
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '" + DEFAULT_SYSTEM + "' -%}{%- set turns = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}{{- " + json.dumps(_TOOLS_HEAD) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + json.dumps(_TOOLS_TAIL) + " -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in turns -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- set reasoning = message.get('reasoning') or message.get('reasoning_content') -%}"
    "{%- if reasoning -%}{{- '<think>\\n' + (reasoning | trim) + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] or '' -}}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}"
    "{%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}"
    "{%- else -%}{{- fn['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] "
    "+ '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


class ThinkRecipe(BaseModel):
    """Everything that decides the built model (saved beside it as ``refinery_recipe.json``).

    Example:
        >>> ThinkRecipe().base, ThinkRecipe().seed
        ('smollm2-135m', 0)
    """

    base: str = "smollm2-135m"
    seed: int = 0
    arith_rows: int = Field(72, ge=1)
    tool_rows: int = Field(24, ge=0)
    max_steps: int = Field(24, ge=1)
    batch_size: int = Field(2, ge=1)
    grad_accum: int = Field(2, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    lora_r: int = Field(16, ge=1)
    max_length: int = Field(320, ge=16)


def _provenance(problem_id: str, step: str, answer: str) -> Provenance:
    return Provenance(source_run=THINK_MODEL, problem_id=problem_id, step=step,
                      strategy="gold", verifier="gold", weight=1.0, answer=answer)


def arith_think_rows(n: int, seed: int = 0) -> list[MessagesRow]:
    """``n`` rows of ``arith`` train problems: the worked solution as thinking, then the answer."""
    from refinery.eval.arith import load_arith

    rows = []
    for ex in load_arith("train", limit=n, seed=seed):
        solution = arith_solution(ex.prompt, ex.private["steps"], str(ex.gold))
        if solution is None:
            continue
        thinking, _, answer = solution.rpartition("\n")
        rows.append(MessagesRow(
            messages=[ChatMessage(role="user", content=ex.prompt),
                      ChatMessage(role="assistant", content=answer, reasoning=thinking)],
            metadata=_provenance(ex.id, "gold_solution", str(ex.gold))))
    return rows


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(properties)}}}


_STRING = {"type": "string"}
_TOOLS = [
    _function("set_timer", "Start a countdown timer.", {"minutes": {"type": "integer"}}),
    _function("translate", "Translate a text into another language.",
              {"text": _STRING, "language": _STRING}),
    _function("get_stock_price", "Get the latest share price of a company.",
              {"symbol": _STRING}),
    _function("find_flights", "Find flights between two cities on a date.",
              {"origin": _STRING, "destination": _STRING, "date": _STRING}),
]
_PHRASES = ["good night", "thank you", "where is the station", "I like tea", "see you soon"]
_LANGUAGES = ["French", "Spanish", "German", "Italian", "Japanese"]
_SYMBOLS = {"Apple": "AAPL", "Microsoft": "MSFT", "Tesla": "TSLA", "Amazon": "AMZN"}
_TOWNS = ["Boston", "Denver", "Vienna", "Prague", "Athens", "Manila", "Quito", "Hanoi"]


def _tool_task(rng: random.Random, i: int) -> tuple[str, str, dict[str, Any]]:
    """A request and the call that answers it, tool ``i % 4``."""
    kind = i % len(_TOOLS)
    if kind == 0:
        m = rng.randint(2, 90)
        return rng.choice(["Set a timer for {m} minutes.", "Remind me in {m} minutes."]
                          ).format(m=m), "set_timer", {"minutes": m}
    if kind == 1:
        text, lang = rng.choice(_PHRASES), rng.choice(_LANGUAGES)
        return f"How do you say '{text}' in {lang}?", "translate", {"text": text,
                                                                  "language": lang}
    if kind == 2:
        company = rng.choice(list(_SYMBOLS))
        return (f"What is {company}'s share price right now?", "get_stock_price",
                {"symbol": _SYMBOLS[company]})
    a, b = rng.sample(_TOWNS, 2)
    date = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return (f"Find me a flight from {a} to {b} on {date}.", "find_flights",
            {"origin": a, "destination": b, "date": date})


def tools_system_prompt(tools: list[dict[str, Any]], system: str = DEFAULT_SYSTEM) -> str:
    """The system turn :data:`CHAT_TEMPLATE` renders for ``tools`` (rows carry it as text)."""
    listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return system + _TOOLS_HEAD + listed + _TOOLS_TAIL


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """One call as the template writes it (and vLLM's ``hermes`` parser reads it).

    Example:
        >>> tool_call_text("set_timer", {"minutes": 5})
        '<tool_call>\\n{"name": "set_timer", "arguments": {"minutes": 5}}\\n</tool_call>'
    """
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments},
                                         ensure_ascii=False) + "\n</tool_call>")


def tool_rows(n: int, seed: int = 0) -> list[MessagesRow]:
    """``n`` tool tasks, each offered its tool and one other, answered by one call."""
    rng = random.Random(f"think-tools/{seed}")
    rows = []
    for i in range(n):
        request, name, arguments = _tool_task(rng, i)
        right = next(t for t in _TOOLS if t["function"]["name"] == name)
        offered = [right, rng.choice([t for t in _TOOLS if t is not right])]
        rng.shuffle(offered)
        thinking = f"The user asks: {request} The {name} tool does this."
        rows.append(MessagesRow(
            messages=[ChatMessage(role="system", content=tools_system_prompt(offered)),
                      ChatMessage(role="user", content=request),
                      ChatMessage(role="assistant", content=tool_call_text(name, arguments),
                                  reasoning=thinking)],
            metadata=_provenance(f"think-tools-{seed}-{i}", "tool_call", name)))
    return rows


def _extend_base(base_dir: str, out: Path) -> None:
    """The base checkpoint with the think and tool-call tokens and :data:`CHAT_TEMPLATE`."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    pieces = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in THINK_TOKENS]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t in THINK_TOKENS])
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():  # each new token starts as the mean of the pieces it replaces
        for token, ids in zip(THINK_TOKENS, pieces, strict=True):
            emb[tokenizer.convert_tokens_to_ids(token)] = emb[ids].mean(dim=0)
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def build_think_model(target: Path, recipe: ThinkRecipe | None = None,
                      progress: bool = False) -> Path:
    """Build the think model into ``target`` (temporary sibling, then renamed in place)."""
    from refinery.distill.train import train

    recipe = recipe or ThinkRecipe()
    base_dir = resolve_model(recipe.base)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _extend_base(base_dir, work / "base")
        rows = arith_think_rows(recipe.arith_rows, recipe.seed)
        rows += tool_rows(recipe.tool_rows, recipe.seed)
        random.Random(recipe.seed).shuffle(rows)
        write_rows(work / "sft.jsonl", rows, "sft")
        train(work / "sft.jsonl", base=str(work / "base"), out=work / "model",
              max_steps=recipe.max_steps, batch_size=recipe.batch_size,
              grad_accum=recipe.grad_accum,
              learning_rate=recipe.learning_rate, lora_r=recipe.lora_r,
              lora_alpha=2 * recipe.lora_r, max_length=recipe.max_length,
              seed=recipe.seed, trainable_tokens=list(THINK_TOKENS), loss_eval_rows=8,
              save_dtype="bfloat16", progress=progress)
        (work / "model" / RECIPE_FILE).write_text(recipe.model_dump_json(indent=2) + "\n")
        try:
            (work / "model").rename(target)
        except OSError:
            # Another process finished first; its result is as good as ours.
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def ensure_think_model(model: BuiltModel = BUILT_MODELS[THINK_MODEL]) -> Path:
    """The cached think model's directory, built on first use (minutes on 2 cores)."""
    target = cached_model_dir(model.name)
    if (target / "config.json").exists():
        return target
    return build_think_model(target, ThinkRecipe(base=model.base))

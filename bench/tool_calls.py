"""Tool calls on the embedded model: does ``tool_choice`` "auto" choose well, and are
the calls right?

Single-turn tasks whose right answer is known, generated from a seed: arithmetic
(``add``, ``subtract``, ``multiply``, ``divide`` on two numbers), unit conversion
(``convert(value, from_unit, to_unit)``), weather and time lookups
(``get_weather(city, unit, day)`` with 1 to 3 arguments, ``get_time(city)``), and
tasks no tool answers (greetings, facts, writing). Each task is offered its
family's tools (the four operations, ``convert``, or the two lookups); a no-tool
task is offered one family's tools too, so "auto" has a real choice both ways.

Every request goes the server's way, in process: a ``ChatCompletionRequest`` with
the tools, ``Service.prepare`` (the tools' prompt, the call's constraint, the
strategy's tool-turn form) and ``Service.run`` on one ``VLLMBackend``; the answer is
read back with ``parse_calls``, as the server does. Sides: passthrough (greedy)
and ``sc(cot, n=5)`` at temperature 0.7, each under "auto" (every task) and
"required" (the tool tasks).

Per side: valid calls (answers that are calls, every call naming an offered tool
with arguments valid under its schema, over the answers that are calls), right
tool and right arguments (over tool tasks; numbers compared numerically, strings
case-blind, an argument the task does not give accepted only at its schema's
default), right "no tool" (no-tool tasks answered in text), calls cut off, prompt
and completion tokens per task, and seconds.

    python bench/tool_calls.py [--tool-tasks 120] [--text-tasks 40] [--seed 0]
        [--sides passthrough/auto,passthrough/required,sc/auto,sc/required]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# Sets the same vLLM environment (KV cache, cores) as the other benches.
import strategy_throughput  # noqa: E402, F401

from refinery.engine.backends.vllm import VLLMBackend  # noqa: E402
from refinery.engine.constraints import Constraint  # noqa: E402
from refinery.engine.hardware import CpuInfo, cpu_dtype  # noqa: E402
from refinery.engine.tool_calls import Call, parse_calls  # noqa: E402
from refinery.serving.config import ServerConfig  # noqa: E402
from refinery.serving.protocol import ChatCompletionRequest  # noqa: E402
from refinery.serving.service import Service  # noqa: E402

MODEL = "smollm2-135m"
SPECS = {"passthrough": (MODEL, 0.0), "sc": (f"sc(cot, n=5)@{MODEL}", 0.7)}
NUMBER = {"type": "number"}


def function(name: str, description: str, properties: dict[str, Any],
             required: list[str]) -> dict[str, Any]:
    """An OpenAI ``tools`` entry."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


OPERATIONS = {"add": "Add two numbers: a + b.", "subtract": "Subtract b from a: a - b.",
              "multiply": "Multiply two numbers: a * b.", "divide": "Divide a by b: a / b."}
UNITS = ["kilometers", "miles", "meters", "feet", "kilograms", "pounds", "celsius",
         "fahrenheit", "liters", "gallons"]
PAIRS = [("kilometers", "miles"), ("miles", "kilometers"), ("meters", "feet"),
         ("feet", "meters"), ("kilograms", "pounds"), ("pounds", "kilograms"),
         ("celsius", "fahrenheit"), ("fahrenheit", "celsius"), ("liters", "gallons"),
         ("gallons", "liters")]
CITIES = ["Paris", "Tokyo", "London", "Berlin", "Madrid", "Cairo", "Sydney", "Toronto",
          "Lima", "Oslo", "Rome", "Seoul", "Nairobi", "Dublin", "Lisbon", "Chicago"]
FAMILIES: dict[str, list[dict[str, Any]]] = {
    "arithmetic": [function(n, d, {"a": NUMBER, "b": NUMBER}, ["a", "b"])
                   for n, d in OPERATIONS.items()],
    "conversion": [function("convert", "Convert a value from one unit to another.",
                            {"value": NUMBER, "from_unit": {"type": "string", "enum": UNITS},
                             "to_unit": {"type": "string", "enum": UNITS}},
                            ["value", "from_unit", "to_unit"])],
    "lookup": [
        function("get_weather", "Get the weather forecast for a city.",
                 {"city": {"type": "string"},
                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                           "default": "celsius"},
                  "day": {"type": "string", "enum": ["today", "tomorrow"],
                          "default": "today"}}, ["city"]),
        function("get_time", "Get the current local time in a city.",
                 {"city": {"type": "string"}}, ["city"])],
}


@dataclass(frozen=True)
class ToolTask:
    """A question, the tools offered, and the right call (None: no tool answers it)."""

    question: str
    family: str
    expected: Call | None = None


@dataclass
class Tally:
    """One side's counts over its tasks."""

    side: str
    tool_tasks: int = 0
    text_tasks: int = 0
    call_answers: int = 0
    valid_calls: int = 0
    right_tool: int = 0
    right_args: int = 0
    right_text: int = 0
    cut: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    misses: list[str] = field(default_factory=list)


def number(rng: random.Random) -> float:
    """A number as a person might type it: an integer, or one with one decimal."""
    return rng.randint(2, 99) if rng.random() < 0.7 else rng.randint(10, 999) / 10


def shown(x: float) -> str:
    return f"{x:g}"


ARITHMETIC = {
    "add": ["What is {a} plus {b}?", "Add {a} and {b}.", "What is the sum of {a} and {b}?"],
    "subtract": ["What is {a} minus {b}?", "Subtract {b} from {a}.",
                 "How much is {a} take away {b}?"],
    "multiply": ["What is {a} times {b}?", "Multiply {a} by {b}.",
                 "What is the product of {a} and {b}?"],
    "divide": ["What is {a} divided by {b}?", "Divide {a} by {b}.",
               "If {a} is shared equally by {b}, how much does each get?"],
}


def arithmetic(rng: random.Random) -> ToolTask:
    op = rng.choice(list(ARITHMETIC))
    a, b = number(rng), number(rng)
    q = rng.choice(ARITHMETIC[op]).format(a=shown(a), b=shown(b))
    return ToolTask(q, "arithmetic", Call(op, {"a": a, "b": b}))


def conversion(rng: random.Random) -> ToolTask:
    src, dst = rng.choice(PAIRS)
    v = number(rng)
    q = rng.choice(["Convert {v} {s} to {d}.", "How many {d} is {v} {s}?",
                    "What is {v} {s} in {d}?"]).format(v=shown(v), s=src, d=dst)
    return ToolTask(q, "conversion", Call("convert", {"value": v, "from_unit": src,
                                                      "to_unit": dst}))


def lookup(rng: random.Random) -> ToolTask:
    city = rng.choice(CITIES)
    if rng.random() < 0.3:
        q = rng.choice(["What time is it in {c}?", "What is the local time in {c} now?"])
        return ToolTask(q.format(c=city), "lookup", Call("get_time", {"city": city}))
    args: dict[str, Any] = {"city": city}
    when = rng.choice(["today", "tomorrow"])
    q = (f"What is the weather in {city}" + (" tomorrow" if when == "tomorrow" else "")
         + "?")
    if when == "tomorrow":
        args["day"] = "tomorrow"
    if rng.random() < 0.4:
        args["unit"] = "fahrenheit"
        q = q[:-1] + ", in fahrenheit?"
    return ToolTask(q, "lookup", Call("get_weather", args))


COUNTRIES = ["France", "Japan", "Italy", "Egypt", "Canada", "Peru", "Norway", "Kenya"]
TOPICS = ["the sea", "autumn", "a cat", "the moon", "coffee", "a mountain", "rain"]
TEXT_TEMPLATES = [
    lambda r: r.choice(["Hi there!", "Hello, how are you?", "Good morning!",
                        "Thanks, that was helpful.", "Hey, nice to meet you."]),
    lambda r: f"What is the capital of {r.choice(COUNTRIES)}?",
    lambda r: r.choice(["Who wrote Hamlet?", "What is photosynthesis?",
                        "Why is the sky blue?", "What language is spoken in Brazil?"]),
    lambda r: f"Write a short poem about {r.choice(TOPICS)}.",
    lambda r: f"Give me one tip for writing an email about {r.choice(TOPICS)}.",
]


def tasks(n_tool: int, n_text: int, seed: int) -> list[ToolTask]:
    """``n_tool`` tasks a tool answers and ``n_text`` that need none, from ``seed``."""
    rng = random.Random(seed)
    makers: list[Callable[[random.Random], ToolTask]] = [arithmetic, conversion, lookup]
    out = [makers[i % len(makers)](rng) for i in range(n_tool)]
    for i in range(n_text):
        q = TEXT_TEMPLATES[i % len(TEXT_TEMPLATES)](rng)
        out.append(ToolTask(q, rng.choice(list(FAMILIES))))
    return out


def same(got: Any, want: Any) -> bool:
    """Numbers compared numerically, strings case-blind."""
    if isinstance(want, (int, float)) and not isinstance(got, bool):
        return isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-9)
    if isinstance(want, str) and isinstance(got, str):
        return got.strip().lower() == want.strip().lower()
    return got == want


def right_arguments(call: Call, want: Call, schema: dict[str, Any]) -> bool:
    """Every argument the task gives, and any other only at its schema's default."""
    props = schema.get("properties", {})
    for key in set(call.arguments) | set(want.arguments):
        if key in want.arguments:
            if key not in call.arguments or not same(call.arguments[key], want.arguments[key]):
                return False
        elif "default" not in props.get(key, {}) or not same(call.arguments[key],
                                                              props[key]["default"]):
            return False
    return True


def schemas(task: ToolTask) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"]["parameters"] for t in FAMILIES[task.family]}


@functools.cache
def validator(family: str, name: str) -> Constraint:
    """The schema check of one offered tool's arguments (compiled once)."""
    return Constraint.from_schema(next(t["function"]["parameters"] for t in FAMILIES[family]
                                       if t["function"]["name"] == name))


def score(tally: Tally, task: ToolTask, text: str) -> None:
    """Add one answer to its side's counts."""
    turn = parse_calls(text)
    offered = schemas(task)
    tally.cut += turn.cut
    if turn.calls:
        tally.call_answers += 1
        tally.valid_calls += all(
            c.name in offered and validator(task.family, c.name).accepts(c.arguments_json)
            for c in turn.calls)
    if task.expected is None:
        tally.text_tasks += 1
        tally.right_text += not turn.calls and not turn.cut
        return
    tally.tool_tasks += 1
    first = turn.calls[0] if turn.calls else None
    if first is not None and first.name == task.expected.name:
        tally.right_tool += 1
        tally.right_args += right_arguments(first, task.expected, offered[first.name])
    elif len(tally.misses) < 3:
        tally.misses.append(f"{task.question!r} -> {text[:80]!r}")


def request(task: ToolTask, spec: str, choice: str, temperature: float,
            max_tokens: int) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=SPECS[spec][0], tools=FAMILIES[task.family],
                                 tool_choice=choice, temperature=temperature,
                                 max_tokens=max_tokens,
                                 messages=[{"role": "user", "content": task.question}])


async def side(service: Service, todo: list[ToolTask], spec: str, choice: str,
               max_tokens: int, concurrency: int) -> Tally:
    """One side: every task of it, ``concurrency`` at a time."""
    tally, gate = Tally(f"{spec}/{choice}"), asyncio.Semaphore(concurrency)
    temperature = SPECS[spec][1]

    async def one(task: ToolTask) -> None:
        async with gate:
            prep = service.prepare(request(task, spec, choice, temperature, max_tokens))
            outcome = await service.run(prep)
        attempt = outcome.traces[0].attempt
        tally.prompt_tokens += outcome.usage.prompt_tokens
        tally.completion_tokens += outcome.usage.completion_tokens
        score(tally, task, attempt.text if attempt is not None else "")
        if (done := tally.tool_tasks + tally.text_tasks) % 40 == 0:
            print(f"{tally.side}: {done}/{len(todo)} tasks", flush=True)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(t) for t in todo))
    tally.seconds = time.perf_counter() - t0
    return tally


async def run(todo: list[ToolTask], sides: list[str], max_tokens: int,
              concurrency: int) -> list[Tally]:
    backend = await VLLMBackend.create(MODEL)
    try:
        service = Service(ServerConfig(), backend)
        await side(service, todo[:2], "passthrough", "auto", 8, 2)  # warm-up: grammars
        out = []
        for name in sides:
            spec, choice = name.split("/")
            mine = [t for t in todo if choice == "auto" or t.expected is not None]
            out.append(await side(service, mine, spec, choice, max_tokens, concurrency))
            print(f"{name}: {out[-1].seconds:.1f} s", flush=True)
        return out
    finally:
        await backend.aclose()


def pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "-"


def report(tallies: list[Tally], cpu: CpuInfo) -> None:
    print(f"\nCPU: {cpu.model}; {cpu_dtype(cpu).log_line()}\n")
    print("| side | valid calls | right tool | right arguments | right no tool | cut off "
          "| prompt tok/task | completion tok/task | seconds |")
    print("|---|---|---|---|---|---|---:|---:|---:|")
    for t in tallies:
        n = t.tool_tasks + t.text_tasks
        print(f"| {t.side} | {pct(t.valid_calls, t.call_answers)} "
              f"| {pct(t.right_tool, t.tool_tasks)} | {pct(t.right_args, t.tool_tasks)} "
              f"| {pct(t.right_text, t.text_tasks)} | {t.cut} "
              f"| {t.prompt_tokens / n:.0f} | {t.completion_tokens / n:.1f} "
              f"| {t.seconds:.1f} |")
    for t in tallies:
        for miss in t.misses:
            print(f"{t.side} missed: {miss}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool-tasks", type=int, default=120)
    ap.add_argument("--text-tasks", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--sides", default="passthrough/auto,passthrough/required,"
                    "sc/auto,sc/required")
    a = ap.parse_args()
    sides = a.sides.split(",")
    for name in sides:
        spec, _, choice = name.partition("/")
        if spec not in SPECS or choice not in ("auto", "required"):
            ap.error(f"--sides: {name!r} is not SPEC/CHOICE with SPEC in "
                     f"{', '.join(SPECS)} and CHOICE auto or required")
    todo = tasks(a.tool_tasks, a.text_tasks, a.seed)
    report(asyncio.run(run(todo, sides, a.max_tokens, a.concurrency)), CpuInfo.read())


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine
    main()

"""OptiLLM's way of naming an approach, mapped to refinery's strategies.

OptiLLM clients pick an approach with a prefix on the model name
(``moa-gpt-4o-mini``) or with ``extra_body={"optillm_approach": "moa"}``.
refinery accepts both for the served model: an approach refinery implements
runs as the spec in :data:`APPROACHES`; one it does not is a 400 naming
refinery's closest strategies (:data:`UNSUPPORTED`); OptiLLM's combinations
(``a&b`` pipeline, ``a|b`` parallel, stacked prefixes ``a-b-model``) are a 400
too. ``SPEC@MODEL`` stays refinery's own form.

A prefix is read as an approach only when the rest of the name is exactly the
served model and the prefix is an OptiLLM name, so a served model whose name
has dashes (``smollm2-135m``, ``Qwen2.5-0.5B-Instruct``) is never split.

Example:
    >>> approach_of("moa-smollm2-135m", "smollm2-135m")
    'moa'
    >>> approach_of("smollm2-135m", "smollm2-135m") is None
    True
    >>> spec_of("self_consistency")
    'sc(cot, n=5)'
"""

from __future__ import annotations

import re
from types import MappingProxyType

from refinery.engine.errors import SpecError

# OptiLLM's "none": the plain model, even when the server has a default strategy.
PASSTHROUGH = ""
# OptiLLM's "auto" as optillm_approach: no approach from the body, the model field decides.
AUTO = "auto"

# OptiLLM approach -> the refinery spec it runs. Sample counts are OptiLLM's defaults.
APPROACHES = MappingProxyType({
    "none": PASSTHROUGH,
    "bon": "best_of_n(cot, n=3)",  # OptiLLM's --best-of-n default: 3 samples, rated by the model
    "self_consistency": "sc(cot, n=5)",  # OptiLLM samples 5
    "moa": "moa",
    "re2": "re2",
    "cot_reflection": "cot_reflection",
    # OptiLLM's defaults (16 warm-up traces of up to 128, 2048-token windows) are sized
    # for long reasoning traces; refinery's deepconf defaults are sized like its sc.
    "deepconf": "deepconf",
    # OptiLLM's plugin runs the code blocks of a reply; tir runs them inside the
    # reasoning and lets the model read their output before it answers.
    "executecode": "tir",
    # OptiLLM's defaults: 2 simulations, exploration weight 0.2, 3 actions per expansion.
    "mcts": "mcts(simulations=2, exploration=0.2, expansions=3)",
    "genselect": "genselect(cot, n=4)",  # OptiLLM compares 4 candidates
})

# OptiLLM approaches and plugins refinery does not implement -> its closest strategies.
UNSUPPORTED = MappingProxyType({
    "rto": "critique_refine",
    "z3": "ssr, cot_reflection",
    "pvg": "best_of_n, critique_refine",
    "rstar": "ssr, sc(cot)",
    "plansearch": "sage(cot), ssr_plan",
    "leap": "cot, sage(cot)",
    "cepo": "ssr_plan, best_of_n",
    "mars": "dei(ssr, critique_refine, sage(cot)), moa",
    "majority_voting": "sc(cot)",
    "deepthink": "sc(cot), cot_reflection",
    "thinkdeeper": "cot",
    "coc": "cot",
    "spl": "sage(cot)",
    "longcepo": "ssr_plan",
    "json": "cot with response_format",
    "router": "a preset (GET /v1/models)",
    "memory": "",
    "privacy": "",
    "readurls": "",
    "mcp": "",
    "web_search": "",
    "deep_research": "",
    "proxy": "",
})

KNOWN = frozenset(APPROACHES) | frozenset(UNSUPPORTED)
COMBINED = re.compile(r"[&|]")


def approach_of(model: str, served: str) -> str | None:
    """The approach prefix of ``model`` (``moa`` in ``moa-smollm2-135m``), else None.

    Only a name ending in ``-`` + ``served`` whose prefix is made of OptiLLM
    names (one, or combined with ``&``, ``|``, ``-``) has one; anything else
    is a plain model name for the caller to look up.
    """
    tail = f"-{served}"
    if not model.endswith(tail) or len(model) == len(tail):
        return None
    prefix = model[: -len(tail)]
    parts = re.split(r"[&|-]", prefix)
    return prefix if all(p in KNOWN for p in parts) else None


def spec_of(approach: str, param: str = "model") -> str:
    """The refinery spec of an OptiLLM approach (:data:`PASSTHROUGH` for ``none``).

    Raises:
        SpecError: a combination, an approach refinery does not implement (naming
            its closest strategies), or a name OptiLLM does not have.
    """
    name = approach.strip()
    if name in APPROACHES:
        return APPROACHES[name]
    if COMBINED.search(name) or "-" in name:
        raise SpecError(
            f"OptiLLM approach {name!r}: combining approaches (a&b, a|b, a-b-MODEL) is not "
            f"supported; compose strategies in a refinery spec instead, e.g. "
            f"'dei(moa, re2)@MODEL' or refinery.strategy", param=param,
            code="approach_not_supported")
    if name in UNSUPPORTED:
        closest = UNSUPPORTED[name]
        hint = (f"; closest here: {closest}" if closest
                else "; refinery has no counterpart")
        raise SpecError(
            f"OptiLLM approach {name!r} is not implemented in refinery{hint}. Supported "
            f"approaches: {', '.join(APPROACHES)}; any refinery spec works as SPEC@MODEL",
            param=param, code="approach_not_supported")
    raise SpecError(f"unknown OptiLLM approach {name!r}; supported: {', '.join(APPROACHES)}",
                    param=param, code="approach_not_supported")

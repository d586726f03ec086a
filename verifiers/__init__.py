"""Verifiers: is an answer right, and how good is a partial one?

Answers: math equivalence, sandboxed code, exact/regex, an LLM judge. Partial
solutions: step scorers (:mod:`.steps`), a calculator, a judge or a process
reward model per step.

Imports ``engine`` only. Every verifier has ``name`` and
``async verify(task, answer, gold=None) -> Verdict``; build one by name with
:func:`get_verifier`.

Example:
    >>> import asyncio
    >>> from refinery.engine.types import Task
    >>> v = get_verifier("math")
    >>> asyncio.run(v.verify(Task.from_prompt("?"), "The answer is $1,000.", "1000")).passed
    True
"""

from refinery.verifiers.base import Verdict, Verifier
from refinery.verifiers.code import CodeVerifier, build_program, extract_code
from refinery.verifiers.exact import ExactVerifier, RegexVerifier
from refinery.verifiers.judge import JudgeVerifier, parse_score
from refinery.verifiers.math import (
    GSM8KVerifier,
    MathVerifier,
    extract_answer,
    extract_boxed,
    extract_gsm8k_flexible,
    extract_gsm8k_strict,
    gsm8k_normalize,
    is_equivalent,
    normalize_answer,
)
from refinery.verifiers.registry import VERIFIERS, get_verifier
from refinery.verifiers.sandbox import RunResult, Sandbox, SandboxConfig
from refinery.verifiers.step_arith import ArithStepScorer, check_step
from refinery.verifiers.step_judge import JudgeStepScorer
from refinery.verifiers.step_prm import PRMFormat, PRMStepScorer
from refinery.verifiers.steps import SCORERS, StepScorer, aggregate, build_scorer

__all__ = [
    "SCORERS",
    "VERIFIERS",
    "ArithStepScorer",
    "CodeVerifier",
    "ExactVerifier",
    "GSM8KVerifier",
    "JudgeStepScorer",
    "JudgeVerifier",
    "MathVerifier",
    "PRMFormat",
    "PRMStepScorer",
    "RegexVerifier",
    "RunResult",
    "Sandbox",
    "SandboxConfig",
    "StepScorer",
    "Verdict",
    "Verifier",
    "aggregate",
    "build_program",
    "build_scorer",
    "check_step",
    "extract_answer",
    "extract_boxed",
    "extract_code",
    "extract_gsm8k_flexible",
    "extract_gsm8k_strict",
    "get_verifier",
    "gsm8k_normalize",
    "is_equivalent",
    "normalize_answer",
    "parse_score",
]

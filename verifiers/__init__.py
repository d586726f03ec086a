"""Verifiers: is an answer right? Math equivalence, sandboxed code, exact/regex, an LLM judge.

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

__all__ = [
    "VERIFIERS",
    "CodeVerifier",
    "ExactVerifier",
    "GSM8KVerifier",
    "JudgeVerifier",
    "MathVerifier",
    "RegexVerifier",
    "RunResult",
    "Sandbox",
    "SandboxConfig",
    "Verdict",
    "Verifier",
    "build_program",
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

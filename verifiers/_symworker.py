"""Symbolic-comparison worker: ``python -m refinery.verifiers._symworker``, JSON lines.

Runs apart from the caller so that the caller can kill it: sympy may spin in C
code (``10**10**10``) where no signal reaches it. Request ``{"a", "b",
"timeout"}``, reply ``{"equal": bool, "method": str}``. The first line written
is ``{"ready": true}`` once the heavy imports are done.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
from typing import Any


class _Comparer:
    """The comparisons, over sympy and math-verify imported once (in the worker only,
    after the memory cap)."""

    def __init__(self) -> None:
        import logging

        logging.disable(logging.CRITICAL)  # math-verify logs every timeout; the parent reports
        import math_verify
        import sympy
        from sympy.parsing import sympy_parser as sp

        self.sympy, self.mv, self.parse_expr = sympy, math_verify, sp.parse_expr
        self.transformations = sp.standard_transformations + (
            sp.implicit_multiplication_application, sp.convert_xor)

    def mv_parse(self, s: str, t: int) -> list:
        """math-verify's parse: plain-text expression first for plain text, else LaTeX."""
        mv = self.mv
        plain = "\\" not in s and re.search(r"[A-Za-z]{2,}", s) is not None
        configs = ([mv.ExprExtractionConfig()], [mv.LatexExtractionConfig()])
        if not plain:
            configs = configs[::-1]
        for cfg in configs:
            text = f"${s}$" if isinstance(cfg[0], mv.LatexExtractionConfig) else s
            got = mv.parse(text, extraction_config=cfg, parsing_timeout=t)
            if got:
                return got
        return []

    def sympy_parse(self, s: str) -> Any:
        """``s`` as a plain sympy expression, or None (LaTeX, too long, unparsable)."""
        if "\\" in s or len(s) > 300:
            return None
        try:
            return self.parse_expr(s, transformations=self.transformations, evaluate=True)
        except Exception:
            return None

    def sympy_equal(self, ca: list, cb: list) -> str | None:
        """The method that found some pair of ``ca`` x ``cb`` equal, or None."""
        for ea in ca:
            for eb in cb:
                try:
                    if self.sympy.simplify(ea - eb) == 0:
                        return "sympy"
                    if ea.free_symbols or eb.free_symbols:
                        continue
                    va, vb = complex(ea.evalf()), complex(eb.evalf())
                    if abs(va - vb) <= 1e-9 + 1e-6 * max(abs(va), abs(vb)):
                        return "sympy-numeric"
                except Exception:
                    continue
        return None

    def compare(self, a: str, b: str, t: int) -> tuple[bool, str]:
        """Whether ``a`` and ``b`` are equal, and which method decided it."""
        pa, pb = self.mv_parse(a, t), self.mv_parse(b, t)
        verify = self.mv.verify
        if pa and pb and (verify(pb, pa, timeout_seconds=t) or verify(pa, pb, timeout_seconds=t)):
            return True, "math-verify"
        # Where math-verify falls short: plain-text expressions ("sqrt(2)/2", "2*pi").
        # Each side as plain sympy and as math-verify parsed it, so "2\\pi" meets "2*pi".
        expr = self.sympy.Expr
        ca = [e for e in (self.sympy_parse(a), *pa[:1]) if isinstance(e, expr)]
        cb = [e for e in (self.sympy_parse(b), *pb[:1]) if isinstance(e, expr)]
        method = self.sympy_equal(ca, cb)
        if method is not None:
            return True, method
        if ca and cb:
            return False, "sympy"
        return False, "math-verify" if (pa and pb) else "unparsed"


def _reply(comparer: _Comparer, line: str) -> dict[str, Any]:
    try:
        req = json.loads(line)
        t = max(1, int(req.get("timeout", 5)))
        equal, method = comparer.compare(str(req["a"]), str(req["b"]), t)
        return {"equal": equal, "method": method}
    except MemoryError:
        return {"equal": False, "method": "memory"}
    except Exception as e:  # a bad request must not kill the worker
        return {"equal": False, "method": f"error: {type(e).__name__}"}


def _main() -> None:
    # The protocol owns the real stdout; anything a library prints goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # A runaway expansion should fail with MemoryError here, not swap the host.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    comparer = _Comparer()
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        out.write(json.dumps(_reply(comparer, line)) + "\n")


if __name__ == "__main__":
    _main()

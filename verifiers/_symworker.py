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


def _main() -> None:
    # The protocol owns the real stdout; anything a library prints goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # A runaway expansion should fail with MemoryError here, not swap the host.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    import logging

    logging.disable(logging.CRITICAL)  # math-verify logs every timeout; the parent reports
    import sympy
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transformations = standard_transformations + (implicit_multiplication_application, convert_xor)

    def mv_parse(s: str, t: int) -> list:
        plain = "\\" not in s and re.search(r"[A-Za-z]{2,}", s) is not None
        configs = ([ExprExtractionConfig()], [LatexExtractionConfig()])
        if not plain:
            configs = configs[::-1]
        for cfg in configs:
            text = f"${s}$" if isinstance(cfg[0], LatexExtractionConfig) else s
            got = parse(text, extraction_config=cfg, parsing_timeout=t)
            if got:
                return got
        return []

    def sympy_parse(s: str):
        if "\\" in s or len(s) > 300:
            return None
        try:
            return parse_expr(s, transformations=transformations, evaluate=True)
        except Exception:
            return None

    def compare(a: str, b: str, t: int) -> tuple[bool, str]:
        pa, pb = mv_parse(a, t), mv_parse(b, t)
        if pa and pb:
            if verify(pb, pa, timeout_seconds=t) or verify(pa, pb, timeout_seconds=t):
                return True, "math-verify"
        # Where math-verify falls short: plain-text expressions ("sqrt(2)/2", "2*pi").
        # Each side as plain sympy and as math-verify parsed it, so "2\\pi" meets "2*pi".
        ca = [e for e in (sympy_parse(a), *pa[:1]) if isinstance(e, sympy.Expr)]
        cb = [e for e in (sympy_parse(b), *pb[:1]) if isinstance(e, sympy.Expr)]
        for ea in ca:
            for eb in cb:
                try:
                    if sympy.simplify(ea - eb) == 0:
                        return True, "sympy"
                    if ea.free_symbols or eb.free_symbols:
                        continue
                    va, vb = complex(ea.evalf()), complex(eb.evalf())
                    if abs(va - vb) <= 1e-9 + 1e-6 * max(abs(va), abs(vb)):
                        return True, "sympy-numeric"
                except Exception:
                    continue
        if ca and cb:
            return False, "sympy"
        return False, "math-verify" if (pa and pb) else "unparsed"

    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            req = json.loads(line)
            t = max(1, int(req.get("timeout", 5)))
            equal, method = compare(str(req["a"]), str(req["b"]), t)
            reply = {"equal": equal, "method": method}
        except MemoryError:
            reply = {"equal": False, "method": "memory"}
        except Exception as e:  # a bad request must not kill the worker
            reply = {"equal": False, "method": f"error: {type(e).__name__}"}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    _main()

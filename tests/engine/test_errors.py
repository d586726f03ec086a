"""The hierarchy drawn in engine/errors.py is the hierarchy the module defines."""

from __future__ import annotations

import inspect
import re

from refinery.engine import errors


def drawn() -> dict[str, tuple[str | None, int]]:
    """Class name -> (drawn parent, drawn status), from the module docstring."""
    out: dict[str, tuple[str | None, int]] = {}
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        m = re.match(r"^([ │├└─]*)([A-Z]\w+)(?: \(also \w+\))? +(\d{3})", line)
        if not m:
            continue
        depth, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        out[name] = (stack[-1][1] if stack else None, int(m.group(3)))
        stack.append((depth, name))
    return out


def test_the_drawing_matches_the_classes() -> None:
    classes = {n: c for n, c in vars(errors).items()
               if inspect.isclass(c) and issubclass(c, errors.RefineryError)}
    picture = drawn()
    assert set(picture) == set(classes)
    for name, cls in classes.items():
        parent, status = picture[name]
        bases = [b.__name__ for b in cls.__bases__ if issubclass(b, errors.RefineryError)]
        assert (bases[0] if bases else None) == parent, name
        assert cls.status == status, name

"""``python -m refinery.cli``: the ``refinery`` command."""

from refinery.cli import main

main()

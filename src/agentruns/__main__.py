"""``python -m agentruns``: the command line, with the current folder importable (as ``python -m``
makes it), so ``--kinds myapp.kinds:KINDS`` finds a project's own modules."""

from agentruns.entrypoints.cli import main

main()

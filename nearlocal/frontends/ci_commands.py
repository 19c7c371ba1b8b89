"""Subcommands for CI and acceptance: `import` (pytest-benchmark JSON -> run), `compare`,
`baseline` and `accept`. Listed in cli.COMMAND_MODULES."""

from __future__ import annotations


def register(sub) -> None:
    from nearlocal.frontends import accept, importer
    from nearlocal.gate import commands as gate

    importer.register(sub)
    gate.register(sub)
    accept.register(sub)

"""The CI gate: `nearlocal compare` and `nearlocal baseline`.

Two questions, one model each (docs/ci.md): code CI asks "did my code get slower?" (the host's
moves are noise between runs that did not take turns), box CI asks "did this box get
slower?" (the host's moves are findings).
Stages hand plain data on: samples (what each case measured) -> model (each case's log ratio,
its standard error) -> verdict (the one place a verdict is assigned) -> render (printers).
The package reads the store and the engine's vocabulary; no front end."""

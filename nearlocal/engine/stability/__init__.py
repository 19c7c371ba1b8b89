"""Box stability, one room: whether the box itself held still while it measured, so that a figure
is the method's and not the host's. It owns the box's settings read back and judged
(`settings`), how busy the box was during a run (`busy`), the host probes a run walks (`hostprobe`)
and how far they moved between two runs (`hostmoves`), runs that take turns on one host
(`turns`), what a page placement landed on (`placement`) and the self-check's verdicts
(`selfcheck`). Below it, probe/ only reads facts (probe/settings.py, probe/links.py) and
core/sampling.py holds the statistic; the engine (runner, worker, fork server), the gate, the
report and the front ends ask this package, and it asks nothing above the engine layer."""

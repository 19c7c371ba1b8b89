"""The engine: the plan (each case resolved once), the runner, its worker processes and fork
server, the stopping rule, host probes between processes and turn-taking between runs."""

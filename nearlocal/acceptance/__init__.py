"""Acceptance: does this box meet a spec? `spec` parses the TOML (requirements on cases or on
what-if figures), `judge` judges a run's rows against it, `render` lays the verdicts out. In the
judging layer beside gate, whatif and report: it uses whatif (derived requirements); the report
and `frontends/accept.py` (the `nearlocal accept` command) use it, never the other way."""

"""The front ends: the command line, its printers and progress, selection of cases from options,
the pytest-benchmark plugin, import of other tools' results and the MPI job. Nothing imports
them but each other."""

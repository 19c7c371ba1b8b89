"""`pytest bench/`: nearlocal's installed cpu tests (nearlocal/bench/test_cpu.py), collected here.

The example a user copies into a test tree of their own: the plugin (options, the
`nearlocal_case` / `nearlocal_host` fixtures, markers) comes with the package through pytest's
`pytest11` entry point, so this file is all a directory needs. With no checkout at all,
`pytest --pyargs nearlocal.bench` runs the same tests.
"""

from nearlocal.bench.test_cpu import test_cpu  # noqa: F401

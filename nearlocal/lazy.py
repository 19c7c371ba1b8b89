"""Heavy libraries imported at their first use, not when a module that names them is imported:
`nearlocal --help` and `probe` should not pay for numba, scipy or pandas (issue 19).

    pd = lazy_import("pandas")      # at module level, instead of `import pandas as pd`

The name is a stand-in module: the first attribute read imports the real one (and every later
read goes straight to it). Nothing is put in `sys.modules` until then, so a test can tell what a
command really imported.
"""

from __future__ import annotations

import importlib
import types


class _LazyModule(types.ModuleType):
    def __getattr__(self, attribute: str):
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)  # later reads are plain attribute reads
        return getattr(module, attribute)


def lazy_import(name: str) -> types.ModuleType:
    """A stand-in for module `name` that imports it on first attribute access."""
    return _LazyModule(name)

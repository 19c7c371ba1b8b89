"""scripts/venv.sh, the set-up both README commands share: which interpreter makes the checkout's
venv, and the one line (exit 2) a stock box gets when it has none that will do. Stub interpreters
first on a PATH that holds no real one; nothing is installed here (scripts/install_check.sh makes
a real venv from a fresh clone under the system's own interpreter)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OS_RELEASE = {
    "ubuntu-22.04": 'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n',
    "debian-12": 'NAME="Debian GNU/Linux"\nID=debian\nVERSION_ID="12"\n',
    "rocky-9": 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n',
    "arch": "NAME=\"Arch Linux\"\nID=arch\n",
}


def stub(bindir: Path, name: str, version: str, *, ensurepip: bool = True) -> None:
    """An interpreter that reports `version` and, unless told, has venv and ensurepip."""
    refuse = "" if ensurepip else 'case "$*" in *ensurepip*) exit 1 ;; esac\n'
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{refuse}case \"$*\" in *version_info*) echo {version} ;; esac\n")
    path.chmod(0o755)


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    """A PATH directory with the system's tools and no Python at all."""
    out = tmp_path / "bin"
    out.mkdir()
    for system in ("/usr/bin", "/bin"):
        for tool in Path(system).iterdir():
            if not tool.name.startswith(("python", "pydoc")) and not (out / tool.name).exists():
                (out / tool.name).symlink_to(tool)
    return out


def venv_sh(bindir: Path, tmp_path: Path, call: str, distro: str = "debian-12",
            **env: str) -> subprocess.CompletedProcess:
    release = tmp_path / "os-release"
    release.write_text(OS_RELEASE[distro])
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {REPO / 'scripts' / 'venv.sh'}; {call}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PATH": str(bindir), "HOME": str(tmp_path), "NEARLOCAL_OS_RELEASE": str(release),
             "NEARLOCAL_VENV": str(tmp_path / ".venv"), **env})


@pytest.mark.parametrize(("distro", "hint"), [
    ("ubuntu-22.04", "sudo apt install python3.11 python3.11-venv"),
    ("rocky-9", "sudo dnf install python3.11 python3.11-pip"),
    ("arch", "Python 3.11 with its venv module"),
])
def test_an_old_python3_and_no_other_is_one_line_naming_the_package(bindir, tmp_path, distro, hint):
    stub(bindir, "python3", "3.10")
    done = venv_sh(bindir, tmp_path, "nearlocal_venv .", distro)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert "python3 here is 3.10" in done.stderr and hint in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_no_python_at_all_says_so(bindir, tmp_path):
    done = venv_sh(bindir, tmp_path, "nearlocal_venv .", "ubuntu-22.04")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "python3 here is missing" in done.stderr


def test_the_newest_python3_x_that_will_do_is_chosen(bindir, tmp_path):
    stub(bindir, "python3", "3.10")
    stub(bindir, "python3.11", "3.11")
    stub(bindir, "python3.13", "3.13")
    stub(bindir, "python3.9", "3.9")
    (bindir / "python3.12").write_text("#!/bin/sh\necho 'pyenv: python3.12: not installed' >&2\nexit 127\n")
    (bindir / "python3.12").chmod(0o755)
    done = venv_sh(bindir, tmp_path, "_nl_pick_python")
    assert done.returncode == 0 and done.stdout.strip() == "python3.13"


def test_python3_itself_is_used_when_it_will_do(bindir, tmp_path):
    stub(bindir, "python3", "3.12")
    stub(bindir, "python3.13", "3.13")
    assert venv_sh(bindir, tmp_path, "_nl_pick_python").stdout.strip() == "python3"


def test_nearlocal_python_names_the_interpreter_and_is_checked(bindir, tmp_path):
    stub(bindir, "python3", "3.12")
    stub(tmp_path, "old-python", "3.9")
    done = venv_sh(bindir, tmp_path, "_nl_pick_python", NEARLOCAL_PYTHON=str(tmp_path / "old-python"))
    assert done.returncode == 2 and "is 3.9; nearlocal needs Python >= 3.11" in done.stderr


@pytest.mark.parametrize(("distro", "hint"), [
    ("debian-12", "sudo apt install python3.12 python3.12-venv"),
    ("rocky-9", "sudo dnf install python3.12 python3.12-pip"),
])
def test_a_python_without_venv_or_ensurepip_is_one_line(bindir, tmp_path, distro, hint):
    """Debian and Ubuntu ship ensurepip in python3.X-venv, apart from the interpreter."""
    stub(bindir, "python3", "3.12", ensurepip=False)
    done = venv_sh(bindir, tmp_path, "nearlocal_venv .", distro)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "has no venv/ensurepip" in done.stderr and hint in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_a_venv_already_there_is_reused_without_installing(tmp_path):
    """The second call of a README command costs nothing: the venv's stamp says this
    pyproject.toml is installed with that spec (the spec "." is served by any extra's)."""
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    real = os.path.realpath(subprocess.run(["bash", "-c", "command -v python3"], capture_output=True,
                                           text=True).stdout.strip())
    (venv / "bin" / "python").symlink_to(real)
    cksum = subprocess.run(["cksum"], stdin=(REPO / "pyproject.toml").open(), capture_output=True,
                           text=True).stdout.split()[0]
    (venv / "nearlocal-installed").write_text(f".[test] {cksum}\n")
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail; source scripts/venv.sh; nearlocal_venv .; "
                       "echo \"$VIRTUAL_ENV\"; command -v python"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "NEARLOCAL_VENV": str(venv), "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(venv), str(venv / "bin" / "python")]
    assert (venv / "nearlocal-installed").read_text() == f".[test] {cksum}\n"  # nothing installed

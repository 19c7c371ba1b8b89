# Sourced by scripts/main.sh and scripts/test.sh (from the checkout's root): nearlocal lives in a
# virtual environment in the checkout, never in a system interpreter (a stock Debian 12 or
# Ubuntu 24.04 python3 refuses `pip install` by PEP 668; Ubuntu 22.04's is 3.10).
#
#   nearlocal_on_path     a script run from anywhere (compare_*.sh, take_turns.sh): the
#                         checkout's venv first on PATH when it has one (main.sh made it).
#   nearlocal_venv SPEC   makes (or reuses) $NEARLOCAL_VENV (default .venv), installs SPEC
#                         (".", ".[test]") into it unless this pyproject.toml is already
#                         installed there with that spec, and puts its bin/ first on PATH.
#
# The interpreter: $NEARLOCAL_PYTHON when set; else python3 when it is >= 3.11; else the newest
# python3.X >= 3.11 on PATH. None, or no venv / ensurepip for it: one line naming what to install
# for this distribution (apt or dnf), exit 2. A venv made by uv (no pip in it) is installed into
# with uv.

# the oldest Python nearlocal runs on: pyproject.toml's requires-python, read here, not copied
read -r -a NEARLOCAL_MIN_PYTHON < <(sed -n 's/^requires-python = ">=\([0-9]*\)\.\([0-9]*\)".*/\1 \2/p' \
  "$(dirname "${BASH_SOURCE[0]}")/../pyproject.toml")

_nl_fail() {  # one line, exit 2: the set-up cannot go on, and says what to do
  echo "error: $*" >&2
  exit 2
}

_nl_version() {  # "3.11" for a working interpreter, nothing for a stub or a missing one
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

_nl_new_enough() {  # X.Y >= the minimum
  local major=${1%%.*} minor=${1#*.}
  [ -n "$1" ] && { [ "$major" -gt "${NEARLOCAL_MIN_PYTHON[0]}" ] || \
    { [ "$major" -eq "${NEARLOCAL_MIN_PYTHON[0]}" ] && [ "$minor" -ge "${NEARLOCAL_MIN_PYTHON[1]}" ]; }; }
}

_nl_distro() {  # apt, dnf or nothing, from os-release (NEARLOCAL_OS_RELEASE: a test's own file)
  local file=${NEARLOCAL_OS_RELEASE:-/etc/os-release} id="" like=""
  if [ -r "$file" ]; then
    id=$(sed -n 's/^ID=//p' "$file" | tr -d '"')
    like=$(sed -n 's/^ID_LIKE=//p' "$file" | tr -d '"')
  fi
  case " $id $like " in
    *" debian "*|*" ubuntu "*) echo apt ;;
    *" fedora "*|*" rhel "*|*" centos "*|*" amzn "*) echo dnf ;;
  esac
}

_nl_install_hint() {  # what to install for Python X.Y with venv, on this distribution
  local want=$1
  case "$(_nl_distro)" in
    apt) echo "sudo apt install python$want python$want-venv" ;;
    dnf) echo "sudo dnf install python$want python$want-pip" ;;
    *) echo "Python $want with its venv module (python.org, pyenv or uv)" ;;
  esac
}

_nl_pick_python() {  # prints the interpreter to make the venv with, or fails with one line
  local want="${NEARLOCAL_MIN_PYTHON[0]}.${NEARLOCAL_MIN_PYTHON[1]}" version candidate best="" best_v=""
  if [ -n "${NEARLOCAL_PYTHON:-}" ]; then
    version=$(_nl_version "$NEARLOCAL_PYTHON")
    _nl_new_enough "$version" || _nl_fail "NEARLOCAL_PYTHON=$NEARLOCAL_PYTHON is ${version:-not a working Python}; nearlocal needs Python >= $want"
    echo "$NEARLOCAL_PYTHON"
    return
  fi
  version=$(_nl_version python3)
  if _nl_new_enough "$version"; then
    echo python3
    return
  fi
  for candidate in $(compgen -c python3. | grep -E '^python3\.[0-9]+$' | sort -u); do
    local v
    v=$(_nl_version "$candidate")  # a pyenv shim of a version not installed prints nothing
    if _nl_new_enough "$v" && { [ -z "$best_v" ] || [ "${v#*.}" -gt "${best_v#*.}" ]; }; then
      best=$candidate best_v=$v
    fi
  done
  [ -n "$best" ] || _nl_fail "nearlocal needs Python >= $want and python3 here is ${version:-missing}, with no newer python3.X on PATH: install it ($(_nl_install_hint "$want")), or name one with NEARLOCAL_PYTHON=/path/to/python3.X"
  echo "$best"
}

nearlocal_venv() {
  local spec=$1 venv=${NEARLOCAL_VENV:-.venv} python version stamp
  version=$(_nl_version "$venv/bin/python")
  if ! _nl_new_enough "$version"; then  # none yet, or one whose interpreter is gone or too old
    python=$(_nl_pick_python) || exit 2
    version=$(_nl_version "$python")
    "$python" -c 'import venv, ensurepip' 2>/dev/null \
      || _nl_fail "$python ($version) has no venv/ensurepip to make $venv with: install it ($(_nl_install_hint "$version"))"
    echo "setting up $venv with $python ($version)" >&2
    "$python" -m venv --clear "$venv" >/dev/null \
      || _nl_fail "$python -m venv $venv failed (see above): install $(_nl_install_hint "$version")"
  fi
  VIRTUAL_ENV=$(cd "$venv" && pwd)
  export VIRTUAL_ENV PATH="$VIRTUAL_ENV/bin:$PATH"
  unset PYTHONHOME
  # installed already, with this spec and this pyproject.toml: a second call costs nothing
  stamp="$spec $(cksum < pyproject.toml | cut -d' ' -f1)"
  # (".": any extra of this pyproject.toml will do)
  if { grep -qxF "$stamp" "$VIRTUAL_ENV/nearlocal-installed" 2>/dev/null || { [ "$spec" = . ] && \
        grep -qE "^\.(\[[a-z0-9,]*\])? ${stamp#* }\$" "$VIRTUAL_ENV/nearlocal-installed" 2>/dev/null; }; } \
      && "$VIRTUAL_ENV/bin/python" -c 'import nearlocal' 2>/dev/null; then
    return
  fi
  if "$VIRTUAL_ENV/bin/python" -m pip --version >/dev/null 2>&1; then
    "$VIRTUAL_ENV/bin/python" -m pip install -q --disable-pip-version-check -e "$spec"
  elif command -v uv >/dev/null; then  # `uv venv` makes a venv without pip
    uv pip install -q --python "$VIRTUAL_ENV/bin/python" -e "$spec"
  else
    _nl_fail "$venv has no pip (made by uv?) and uv is not on PATH: remove $venv or put uv on PATH"
  fi
  echo "$stamp" >> "$VIRTUAL_ENV/nearlocal-installed"
}

nearlocal_on_path() {
  local venv
  venv="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/${NEARLOCAL_VENV:-.venv}"
  if [ -x "$venv/bin/python" ]; then
    export VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH"
  fi
}

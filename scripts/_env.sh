# Sourced by the scripts: a project virtualenv with KVCompass and its test tools.
# Works on a fresh machine with only Python 3.11+ and pip; re-runs are quick no-ops.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVC_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.kvcompass-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]"
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

# Sourced by the scripts: a project virtualenv with KVCompass and its test tools.
# Works on a fresh machine with only Python 3.11+ and pip; re-runs are quick no-ops.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVC_VENV:-$ROOT/.venv}"
# The interpreter: $PYTHON if set; else the distribution's /usr/bin/python3 if it is 3.11+
# and can make venvs (Debian's needs python3-venv, which brings ensurepip); else python3
# from PATH. Debian builds its interpreter with profile-guided and link-time optimisation,
# linked statically; the pyenv python3 first on PATH on these machines has neither and
# runs through a shared libpython, and ran the simulator 1.06-1.17x slower (same code,
# same records). A project venv made from another interpreter is made anew; a KVC_VENV
# is the caller's and is kept as it is.
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if /usr/bin/python3 -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' \
        2>/dev/null; then
        PYTHON=/usr/bin/python3
    fi
fi
if [ -z "${KVC_VENV:-}" ] && [ -x "$VENV/bin/python" ]; then
    real='import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))'
    have="$("$VENV/bin/python" -c "$real")"
    want="$("$PYTHON" -c "$real")"
    if [ "$have" != "$want" ]; then
        echo "== $VENV is of $have; making it anew with $want" >&2
        rm -rf "$VENV"
    fi
fi
# The Cython modules need a C compiler, the interpreter's headers and the xxHash header
# (Debian: gcc, python3-dev, libxxhash-dev; installed here as redis-server is below).
headers="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
xxhash_header() { echo '#include <xxhash.h>' | cc -E - >/dev/null 2>&1; }
if ! command -v cc >/dev/null 2>&1 || [ ! -f "$headers/Python.h" ] || ! xxhash_header; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing a C compiler, the Python headers and xxhash.h (apt)" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc python3-dev libxxhash-dev \
            >/dev/null
    else
        echo "error: compiling the Cython modules needs a C compiler (cc), $headers/Python.h" \
            "and xxhash.h. Install them (Debian/Ubuntu:" \
            "sudo apt-get install -y gcc python3-dev libxxhash-dev)." >&2
        exit 1
    fi
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.kvcompass-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]"
    touch "$STAMP" "$VENV/.kvcompass-native"  # the install compiled the native modules
fi
# The Cython modules (shared/**/*.pyx) and the modules mypyc compiles (pyproject's
# [tool.kvcompass] mypyc) are built in place by the install; an edited source, or one
# without its compiled module, is built again (a stale module would run the old code:
# tests/unit/test_compiled_modules.py fails on one).
NATIVE_STAMP="$VENV/.kvcompass-native"
mypyc_sources() {
    "$PYTHON" -c 'import sys, tomllib
for source in tomllib.load(open(sys.argv[1], "rb"))["tool"]["kvcompass"]["mypyc"]:
    print(f"{sys.argv[2]}/{source}")' "$ROOT/pyproject.toml" "$ROOT"
}
stale_native() {
    [ ! -f "$NATIVE_STAMP" ] || [ "$ROOT/setup.py" -nt "$NATIVE_STAMP" ] && return 0
    local source
    while IFS= read -r source; do
        [ "$source" -nt "$NATIVE_STAMP" ] && return 0
        case "$source" in
            *.pyx | *.py) compgen -G "${source%.*}.cpython-*.so" >/dev/null || return 0 ;;
        esac
    done < <(find "$ROOT/shared" -name '*.pyx' -o -name '*.pxd'; mypyc_sources)
    return 1
}
if stale_native; then
    echo "== compiling the Cython modules" >&2
    "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
    touch "$NATIVE_STAMP"
fi
# numba compiles the index's write path once per machine and caches it beside the
# source; doing it here keeps that first compile out of services' start and tests' timing.
KERNEL_STAMP="$VENV/.kvcompass-kernel"
if [ ! -f "$KERNEL_STAMP" ] || [ "$ROOT/shared/kvcompass/index/kernel.py" -nt "$KERNEL_STAMP" ]
then
    echo "== compiling the index write kernel (once; tens of seconds)" >&2
    "$VENV/bin/python" -c "from kvcompass.index.ludo import compile_write_kernel as c; c()"
    touch "$KERNEL_STAMP"
fi
# The integration tests and `kvcompass infra up` run Debian's redis-server
# (not needed when KVC_REDIS_URL points at a running Redis).
if [ -z "${KVC_REDIS_URL:-}" ] && ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing redis-server (apt)" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    else
        echo "error: redis-server is not on PATH. Install it (Debian/Ubuntu:" \
            "sudo apt-get install -y redis-server; macOS: brew install redis)," \
            "or set KVC_REDIS_URL to a running Redis." >&2
        exit 1
    fi
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

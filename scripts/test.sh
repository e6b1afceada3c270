#!/usr/bin/env bash
# The whole check, as CI runs it (.ci/run):
#   1. install everything into .venv (scripts/install.sh) and lint with ruff; (1b) the vLLM engine environment
#      into .venv-vllm (scripts/install_engine.sh: `gpubox engine install vllm`);
#   2. the full test suite in .venv (arguments go to this pytest run, e.g. `./scripts/test.sh -k search`);
#   3. pyright (standard mode) on the package as installed (scripts/typecheck.sh);
#   4. the fast tests and the transport tests again on Python 3.13 in .venv313 with a core-only install
#      (`.[dev]`, no torch): tests that need an extra skip there with a reason, so this proves a minimal
#      install runs green;
#   5. the built wheel, not the checkout: scripts/wheel_check.sh (a fresh venv outside the repository: gpubox
#      doctor, one stdio tool call, uvx; about 1.5 minutes).
# 1b and 3-5 run one after another beside stage 2 (in the background, their output printed when it ends).
# Set GPUBOX_SKIP_TYPECHECK=1, GPUBOX_SKIP_PY313=1 or GPUBOX_SKIP_WHEEL=1 to leave a stage out locally (CI runs all of them).
#
# `./scripts/test.sh --fast` is the check to run before every commit (~2-3 minutes on 2 cores): ruff and every
# test not marked slow (no model load, training, worker process or index build), in .venv; it installs only when
# .venv is missing or pyproject.toml / constraints.txt are newer than the last install. Arguments after --fast go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# pytest exits 5 when it collected no tests: a typo in a path or -k must not pass as a green run.
run_pytest() {
    local label=$1 py=$2
    shift 2
    local rc=0
    "$py" -m pytest -q "$@" || rc=$?
    if [ "$rc" -eq 5 ]; then
        echo "test.sh: $label: pytest collected no tests (exit 5); check the paths / -k expression" >&2
    elif [ "$rc" -ne 0 ]; then
        echo "test.sh: $label: pytest failed (exit $rc)" >&2
    fi
    return "$rc"
}

stage() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)" >&2; }

if [ "${1:-}" = "--fast" ]; then
    shift
    start=$(date +%s)
    if [ ! -x .venv/bin/python ] || [ pyproject.toml -nt .venv/.gpubox-installed ] \
        || [ constraints.txt -nt .venv/.gpubox-installed ]; then
        stage "install .venv"
        ./scripts/install.sh && touch .venv/.gpubox-installed
    fi
    stage "ruff"
    .venv/bin/ruff check server tools resources prompts tests examples bench
    stage "pytest (fast tier: -m 'not slow')"
    run_pytest "fast tier" .venv/bin/python -m "not slow" "$@"
    echo "test.sh: fast tier passed in $(($(date +%s) - start)) s" >&2
    exit 0
fi

stage "install .venv"
./scripts/install.sh
touch .venv/.gpubox-installed

stage "ruff"
.venv/bin/ruff check server tools resources prompts tests examples bench

# Stages 1b and 3-5 run beside the main suite, one after another, their output kept until it ends: the suite
# leaves a core idle about half its time (bench/results/ci_stages.md), and they need nothing it makes. The vLLM
# environment comes first, under .venv-vllm.lock: its tests (tests/serve/test_engine.py) come late in the suite and
# wait for the lock, so they never see a half-made environment.
side_log="$(mktemp)"
side_stages() {
    stage "install the vLLM engine environment (.venv-vllm) for the serving tests"
    ./scripts/install_engine.sh 9>&-
    exec 9>&-  # the environment is made: its tests may start
    if [ "${GPUBOX_SKIP_TYPECHECK:-0}" != 1 ]; then
        stage "pyright (installed package)"
        ./scripts/typecheck.sh
    fi
    if [ "${GPUBOX_SKIP_PY313:-0}" != 1 ]; then
        py313_stage
    fi
    if [ "${GPUBOX_SKIP_WHEEL:-0}" != 1 ]; then
        stage "wheel (built wheel in a fresh venv outside the checkout: doctor, stdio call, uvx)"
        ./scripts/wheel_check.sh
    fi
}
py313_stage() {
    PY313="${GPUBOX_PY313:-$HOME/.pyenv/versions/3.13.0/bin/python}"
    [ -x "$PY313" ] || PY313="$(command -v python3.13 || true)"
    if [ -z "$PY313" ] || [ ! -x "$PY313" ]; then
        echo "test.sh: NOTE: no Python 3.13 found (set GPUBOX_PY313); the core-only 3.13 run is skipped" >&2
        return 0
    fi
    stage "pytest (.venv313: Python 3.13, core-only install)"
    [ -x .venv313/bin/python ] || "$PY313" -m venv .venv313
    .venv313/bin/pip install -q -e ".[dev]"
    if .venv313/bin/python -c "import torch" 2>/dev/null; then
        echo "test.sh: .venv313 must stay core-only but has torch; remove .venv313 and rerun" >&2
        return 1
    fi
    # Fast tests plus the real transports (stdio/HTTP/SSE subprocesses, where interpreter changes show);
    # the other slow tests load models or index code, which needs extras .venv313 does not have.
    run_pytest ".venv313 (not slow)" .venv313/bin/python -m "not slow" -p no:cacheprovider
    run_pytest ".venv313 (transports)" .venv313/bin/python tests/server/test_transports.py -p no:cacheprovider
}
side_pid=""
end_side() {  # on any exit (Ctrl-C too): no side stage outlives this script, holding the lock or a venv
    if [ -n "$side_pid" ] && kill -0 "$side_pid" 2>/dev/null; then
        kill -- "-$side_pid" 2>/dev/null || true
    fi
    rm -f "$side_log"
}
trap end_side EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
exec 9>.venv-vllm.lock
flock 9
set -m  # the side job in a process group of its own, which end_side can end whole
(set -e; side_stages) >"$side_log" 2>&1 &
side_pid=$!
set +m
exec 9>&-  # the side job holds the lock now, until the environment is made

stage "pytest (.venv, every extra)"
# the 25 slowest tests are kept in bench/results/test_durations.txt after each full run (issue #24)
durations="$(mktemp)"
rc=0
run_pytest ".venv" .venv/bin/python --durations=25 "$@" | tee "$durations" || rc=$?
if [ "$#" -eq 0 ] && [ "$rc" -eq 0 ]; then
    { echo "# ./scripts/test.sh full run, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
      sed -n '/slowest 25 durations/,/^=\+ short test summary\|passed\|failed/p' "$durations"; } \
        > bench/results/test_durations.txt
fi
rm -f "$durations"

stage "the stages run beside the suite (their output as they print it, until they end)"
# followed, not read once they end: a stage that hangs shows where, live (in the background, so that a signal
# ends this script and them at once instead of after them)
tail -n +1 --pid="$side_pid" -f "$side_log" >&2 &
tail_pid=$!
side_rc=0
wait "$side_pid" || side_rc=$?
wait "$tail_pid" || true
if [ "$side_rc" -ne 0 ]; then
    echo "test.sh: a stage beside the suite failed (exit $side_rc): its output is above" >&2
fi
[ "$rc" -eq 0 ] || exit "$rc"
[ "$side_rc" -eq 0 ] || exit "$side_rc"
stage "all checks passed"

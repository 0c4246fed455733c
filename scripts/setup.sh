#!/usr/bin/env bash
# Installs what memfit needs on a Debian 12 machine (as root, or with sudo), idempotently.
#   scripts/setup.sh native    compilers, CMake, Ninja, nlohmann-json, Catch2, yaml-cpp
#   scripts/setup.sh wasm      + Emscripten and Node.js
#   scripts/setup.sh browser   + Chromium and the npm packages of the browser tests (tests/browser)
#   scripts/setup.sh python    + the validation venv (torch, transformers, peft; a few GB, once) and
#                              the headers `pip install .` (the Python package) builds against
#   scripts/setup.sh all       everything
set -euo pipefail
cd "$(dirname "$0")/.."

want() { for w in "$@"; do [[ " ${PARTS} " == *" ${w} "* || " ${PARTS} " == *" all "* ]] && return 0; done; return 1; }
PARTS=" ${*:-native} "

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
apt_packages=()
need_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || apt_packages+=("$1"); }

if want native wasm browser python; then
  for p in cmake ninja-build g++ clang libclang-rt-14-dev nlohmann-json3-dev catch2 libyaml-cpp-dev git python3; do need_pkg "$p"; done
fi
if want wasm; then need_pkg emscripten; fi
if want browser; then need_pkg chromium; fi
if want python; then need_pkg python3-venv; need_pkg python3-dev; fi  # python3-dev: the memfit extension (pip install .)
if want wasm browser && ! command -v node >/dev/null; then need_pkg nodejs; need_pkg npm; fi
if ((${#apt_packages[@]})); then
  echo "setup: installing ${apt_packages[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi
if want wasm browser && [[ -f web/package.json ]]; then  # the page's YAML parser (web/intake.js)
  (cd web && { [[ -d node_modules ]] && npm ls --silent >/dev/null 2>&1; } || npm ci --silent --no-audit --no-fund)
fi
if want browser && [[ -f tests/browser/package.json ]]; then
  (cd tests/browser && { [[ -d node_modules ]] && npm ls --silent >/dev/null 2>&1; } || npm ci --silent --no-audit --no-fund)
fi
if want python && [[ -x scripts/setup_python.sh ]]; then scripts/setup_python.sh >/dev/null; fi
echo "setup: ready (${PARTS# })"

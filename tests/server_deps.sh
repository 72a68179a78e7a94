#!/usr/bin/env bash
# tests/server_deps.sh - installs what dllm-server's build and tests need, quietly, and only what is missing:
# libmicrohttpd and cJSON (Debian packages, found through pkg-config) and the official `openai` Python package
# (tests/server_test.py uses it when importable). DLLM_SERVER_CHROMIUM=1 adds Debian's chromium and chromium-driver
# for the canvas page's headless-browser test (skipped without them). Safe to run again: a second run installs nothing.
set -euo pipefail

missing=()
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists libmicrohttpd 2>/dev/null || missing+=(libmicrohttpd-dev)
pkg-config --exists libcjson 2>/dev/null || missing+=(libcjson-dev)
if [ "${DLLM_SERVER_CHROMIUM:-0}" = 1 ]; then
    command -v chromium >/dev/null || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
fi
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "server_deps: installed ${missing[*]}"
fi

if ! python3 -c "import openai" 2>/dev/null; then
    # Debian's python marks the system environment as externally managed: pip needs to be told it may install there
    python3 -m pip install -q openai 2>/dev/null || python3 -m pip install -q --break-system-packages openai
    echo "server_deps: installed the openai Python package"
fi

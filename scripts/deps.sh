#!/usr/bin/env bash
# Installs the Debian 12 packages Alloy builds with (skips what is already there).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
      libpcre2-dev nlohmann-json3-dev libcli11-dev libgtest-dev libutf8proc-dev libcpp-httplib-dev libssl-dev python3-venv
      chromium)  # chromium: the chat page's test (tests/server/chat_page_test.py) runs it headless
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

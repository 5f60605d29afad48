#!/usr/bin/env bash
# Installs what tests/console.rs drives: headless Chromium and chromedriver,
# Debian's packages `chromium` and `chromium-driver` (apt needs root). Only
# what is missing is installed; the test fails, never skips, without them.
set -euo pipefail
pkgs=()
command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
command -v chromedriver >/dev/null 2>&1 || pkgs+=(chromium-driver)
if [ ${#pkgs[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"
fi

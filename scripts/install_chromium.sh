#!/usr/bin/env bash
# Installs Debian's chromium (used headless by the browser tests of the widgets and the slides) and npm (the
# slides fetch reveal.js and MathJax from the npm registry once).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core npm

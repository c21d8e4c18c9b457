#!/usr/bin/env bash
# What the browser tests need, installed only where it is missing, each on its own terms:
#
#   chromium  Debian's chromium (+ fonts-dejavu-core), asked of apt only when no chromium is on PATH.
#             Needed by tests/widgets/test_browser.py and tests/scripts/test_slides.py (headless, never downloaded
#             by a test tool).
#   npm       asked of apt only when there is no npm. When a Node.js is installed that does not come from
#             Debian (NodeSource's ships its own npm; another may not), apt's npm would replace or fight it,
#             so apt is first asked for a dry run and nothing is installed when it refuses. Needed once by
#             tests/scripts/test_slides.py (reveal.js and MathJax from the npm registry into .cache/slides-assets).
#
# Whatever cannot be installed is named, with the tests that need it, and the script exits 0: those tests
# skip with the same reason on a laptop and fail under CI=true, so `make test` still runs everything else.
set -uo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

want=()
have chromium || want+=(chromium fonts-dejavu-core)
have npm || want_npm=1
if [ ${#want[@]} -eq 0 ] && [ -z "${want_npm:-}" ]; then exit 0; fi

SUDO=()
if [ "$(id -u)" != "0" ]; then
    if have sudo; then SUDO=(sudo -n); fi
fi
export DEBIAN_FRONTEND=noninteractive
missing=()

apt_ok=1
if ! have apt-get; then
    apt_ok=0
    echo "install_chromium.sh: no apt-get on this machine; install the packages below by hand." >&2
elif ! "${SUDO[@]}" apt-get update -q; then
    apt_ok=0
    echo "install_chromium.sh: 'apt-get update' failed (root or sudo rights are needed)." >&2
fi

if [ ${#want[@]} -gt 0 ]; then
    if [ "$apt_ok" = 1 ] && "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${want[@]}"; then
        :
    else
        missing+=("chromium (Debian package 'chromium'): tests/widgets/test_browser.py, tests/scripts/test_slides.py")
    fi
fi

if [ -n "${want_npm:-}" ]; then
    if [ "$apt_ok" = 1 ] && "${SUDO[@]}" apt-get install -s -q --no-install-recommends npm >/dev/null 2>&1; then
        "${SUDO[@]}" apt-get install -y -q --no-install-recommends npm ||
            missing+=("npm: tests/scripts/test_slides.py (once, to fetch reveal.js and MathJax)")
    else
        node_note=""
        if have node; then
            node_note=" (apt's npm conflicts with the installed Node.js $(node --version 2>/dev/null) at $(command -v node):"
            node_note+=" install the npm of that Node.js distribution instead)"
        fi
        missing+=("npm${node_note}: tests/scripts/test_slides.py (once, to fetch reveal.js and MathJax)")
    fi
fi

if [ ${#missing[@]} -gt 0 ]; then
    echo "install_chromium.sh: could not install what these tests need (they skip here, and fail under CI=true):" >&2
    for m in "${missing[@]}"; do echo "  - $m" >&2; done
fi
exit 0

#!/usr/bin/env bash
# The test command, on a fresh machine or a used one: install what the suite needs, then run it.
#
#   scripts/test.sh                                           # the whole suite (CI runs exactly this)
#   scripts/test.sh -m "not slow and not ray and not browser"  # the fast subset, < 1 minute
#
# Arguments go to pytest. Steps:
#   1. Debian's chromium for the browser test, when it is missing and this user may install it
#      (root, or password-less sudo) with apt-get; otherwise the browser test fails with the
#      one-line install command.
#   2. The Python extras: pip install -e ".[test]" (with whatever python is first on PATH).
#   3. python -m pytest -q --durations=20 "$@"
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    sudo="none"
  fi
  if [ "$sudo" != none ]; then
    echo "scripts/test.sh: installing Debian's chromium for the browser test" >&2
    $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "scripts/test.sh: chromium is missing and this user cannot install it; the browser test will say how" >&2
  fi
fi

export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1  # the browser test drives Debian's chromium, never a download
python -m pip install -q -e ".[test]"

set +e
python -m pytest -q --durations=20 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "scripts/test.sh: no test was selected (pytest exit 5): check the -m / -k expression or the paths given" >&2
  rc=1
fi
exit "$rc"

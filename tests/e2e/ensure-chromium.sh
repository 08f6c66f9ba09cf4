#!/usr/bin/env bash
# Print the path of a Chromium for the browser tests (tests/e2e), installing Debian's package
# when this user may (root, as in CI's .ci/run). Otherwise fail with one line saying what to do.
# Order: $WORLDSERVE_E2E_CHROMIUM, then chromium / chromium-browser on PATH, then apt-get.
set -euo pipefail

found() { printf '%s\n' "$1"; exit 0; }

if [[ -n "${WORLDSERVE_E2E_CHROMIUM:-}" ]]; then
  [[ -x "$WORLDSERVE_E2E_CHROMIUM" ]] && found "$WORLDSERVE_E2E_CHROMIUM"
  echo "worldserve: WORLDSERVE_E2E_CHROMIUM=$WORLDSERVE_E2E_CHROMIUM is not an executable" >&2
  exit 1
fi
for name in chromium chromium-browser; do
  path="$(command -v "$name" 2>/dev/null || true)"
  [[ -n "$path" ]] && found "$path"
done
if [[ "$EUID" == 0 ]] && command -v apt-get >/dev/null; then
  echo "worldserve: installing chromium for the browser tests (apt-get)" >&2
  apt-get update -qq >&2 && apt-get install -y -qq chromium >&2
  path="$(command -v chromium 2>/dev/null || true)"
  [[ -n "$path" ]] && found "$path"
fi
echo "worldserve: the browser tests need Chromium: run 'sudo apt-get install chromium' (or set" \
  "WORLDSERVE_E2E_CHROMIUM=/path/to/chromium), or run 'make test BROWSER=0' to leave them out" >&2
exit 1

#!/usr/bin/env bash
# Regenerate image/pi/package-lock.json after editing package.json; the lock
# names no registry host (scripts/npm-relock.sh says how).
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/npm-relock.sh" "$(dirname "${BASH_SOURCE[0]}")"

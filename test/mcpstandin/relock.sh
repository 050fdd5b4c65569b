#!/usr/bin/env bash
# Regenerate test/mcpstandin/package-lock.json after editing package.json,
# as for the image: the lock names no registry host (scripts/npm-relock.sh).
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/npm-relock.sh" "$(dirname "${BASH_SOURCE[0]}")"

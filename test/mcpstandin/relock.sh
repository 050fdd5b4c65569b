#!/usr/bin/env bash
# Regenerate test/mcpstandin/package-lock.json after editing package.json,
# as image/pi/relock.sh does for the image: the lock names no registry host
# (no "resolved", no "funding" URLs), so npm ci fetches each name@version
# from whatever registry the machine's npm is configured with and checks it
# against the lock's integrity hash.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
rm -f package-lock.json
npm install --package-lock-only --omit-lockfile-registry-resolved=true \
	--ignore-scripts --no-audit --no-fund --loglevel=error
node -e '
const fs = require("fs");
const l = JSON.parse(fs.readFileSync("package-lock.json", "utf8"));
for (const p of Object.values(l.packages || {})) { delete p.resolved; delete p.funding; }
fs.writeFileSync("package-lock.json", JSON.stringify(l, null, 2) + "\n");
'
if grep -nE '[A-Za-z][A-Za-z0-9+.-]*://' package-lock.json package.json; then
	echo "relock: a URL is left in the lock" >&2
	exit 1
fi
echo "relock: package-lock.json written ($(grep -c '"node_modules/' package-lock.json) packages)"

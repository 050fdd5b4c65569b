#!/usr/bin/env bash
# npm-relock.sh DIR: regenerate DIR/package-lock.json after editing its
# package.json (image/pi and test/mcpstandin call it). The lock carries no
# registry host: npm omits "resolved" (omit-lockfile-registry-resolved)
# and this script drops "resolved" and "funding" entries in case an npm
# version writes them anyway. npm ci then fetches each name@version from
# whatever registry the building machine's npm is configured with and
# checks it against the lock's integrity hash.
set -euo pipefail
cd "${1:?usage: npm-relock.sh DIR}"
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

#!/usr/bin/env bash
# make demo: compile the reference pi-session facts and explain the bundle.
#
# The reference facts name host paths under /srv/paseo. So that the demo
# needs no root and touches nothing outside the checkout, it builds that
# tree under .demo/host and resolves bind sources beneath it
# (--resolve-root); every other check runs exactly as in production.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${PASEO_POLICY:-bin/paseo-policy}
demo=.demo
rm -rf "$demo"
mkdir -p "$demo/host"
# tree.txt lines: "dir PATH", "file PATH" (empty) or "text PATH CONTENT".
while read -r kind path rest; do
  case "$kind" in
    dir) mkdir -p "$demo/host$path" ;;
    file) mkdir -p "$(dirname "$demo/host$path")" && : > "$demo/host$path" ;;
    text) mkdir -p "$(dirname "$demo/host$path")" && printf '%s\n' "$rest" > "$demo/host$path" ;;
  esac
done < testdata/base/tree.txt

echo "== compile testdata/base/facts.json (pi-session, host topology)"
"$bin" compile --facts testdata/base/facts.json --registry testdata/base/registry.json \
  --resolve-root "$demo/host" --out "$demo/bundle"
echo
echo "== validate"
"$bin" validate "$demo/bundle"
echo
echo "== explain"
"$bin" explain "$demo/bundle"
echo
echo "== what the agent may reach (egress.json)"
cat "$demo/bundle/egress.json"

#!/usr/bin/env bash
# make demo.
#
# As root: the real thing (test/cmd/paseo-demo, docs/demo.md). The pinned
# runsc runs the real Pi image, started through the supervisor from the
# reference facts; one scripted turn (the fake model, on a test host in the
# demo's own network namespaces) writes a file in the workspace and tries
# what the policy forbids. It prints the transcript, the file, the grants,
# what was used and blocked and each step's time, writes out/demo.json,
# leaves nothing behind, and fails unless the turn ran in gVisor and every
# forbidden attempt was contained.
#
# Without root: compile the reference facts and explain the bundle, then
# say what the rest needs. The reference facts name host paths under
# /srv/paseo; so that this part needs no root and touches nothing outside
# the checkout, it builds that tree under .demo/host and resolves bind
# sources beneath it (--resolve-root); every other check runs exactly as
# in production.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${PASEO_POLICY:-bin/paseo-policy}
runsc=${RUNSC:-bin/runsc}
image=${IMAGE:-.image}
if [[ $(id -u) == 0 ]]; then
  exec "${PASEO_DEMO:-bin/paseo-demo}" --runsc "$runsc" --image "$image" --work .demo --out out/demo.json
fi

demo=.demo
rm -rf "$demo"
trap 'rm -rf "$demo"' EXIT
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
echo
echo "== the sandboxed turn was skipped: it needs root"
echo "As root, make demo runs the real Pi in gVisor through the supervisor on one"
echo "scripted turn (docs/demo.md). It makes network namespaces, nftables rules and"
echo "cgroups, and runs runsc, so it needs:"
echo "  - root: run \`sudo make demo\`"
have() { if [[ -e $1 ]]; then echo "present"; else echo "missing: \`$2\` (as root) builds it"; fi; }
echo "  - the pinned runsc at $runsc: $(have "$runsc" "make runsc")"
echo "  - the Pi image at $image: $(have "$image/image.json" "make image")"
echo "  (as root, make demo builds both first; each is a no-op when up to date)"

#!/usr/bin/env bash
# image/digest.sh ROOTFS [LISTING]
#
# Prints the image digest "sha256:<hex>" of the tree at ROOTFS and, with
# LISTING, writes the listing it hashed there. The listing has one line per
# entry (the root itself is "."), sorted bytewise by path (LC_ALL=C), each
#
#   path TAB type TAB mode TAB uid TAB gid TAB size TAB sha256 TAB target LF
#
# type is find's %y letter (f regular, d directory, l symlink); mode is the
# octal permission bits with setuid/setgid/sticky (find %m, e.g. 755, 1777,
# 4755); size is the byte size for f and l and "-" for d; sha256 is the
# content hash for f and "-" otherwise; target is the symlink target for l
# and "-" otherwise. The digest is the sha256 of the whole listing. mtimes,
# inode numbers, hard-link identity and extended attributes are not hashed.
# Devices, fifos and sockets, and names with a tab, newline or backslash, are
# refused: the image has none and they would make the listing ambiguous.
set -euo pipefail
export LC_ALL=C

root=${1:?usage: digest.sh ROOTFS [LISTING]}
listing=${2:-}
[[ -d $root ]] || { echo "digest: $root is not a directory" >&2; exit 1; }
cd "$root"

bad=$(find . \( -name $'*\t*' -o -name $'*\n*' -o -name '*\\*' \) -print -quit)
[[ -z $bad ]] || { echo "digest: refusing a name with tab, newline or backslash: $bad" >&2; exit 1; }
special=$(find . ! -type f ! -type d ! -type l -print -quit)
[[ -z $special ]] || { echo "digest: refusing a special file: $special" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Content hashes: "hash  ./path" from sha256sum, keyed by path.
find . -type f -print0 | xargs -0 -r -n 256 sha256sum >"$tmp/sums"
find . -printf '%P\t%y\t%m\t%U\t%G\t%s\t%l\n' >"$tmp/entries"

awk -F'\t' -v OFS='\t' '
	FNR == NR { h = substr($0, 1, 64); p = substr($0, 67); sub(/^\.\//, "", p); sum[p] = h; next }
	{
		path = ($1 == "") ? "." : $1
		size = ($2 == "d") ? "-" : $6
		hash = ($2 == "f") ? sum[$1] : "-"
		target = ($2 == "l") ? $7 : "-"
		if ($2 == "f" && hash == "") { print "digest: no hash for " path > "/dev/stderr"; exit 1 }
		print path, $2, $3, $4, $5, size, hash, target
	}
' "$tmp/sums" "$tmp/entries" | sort -t $'\t' -k1,1 >"$tmp/listing"

if [[ -n $listing ]]; then
	cp "$tmp/listing" "$listing"
fi
echo "sha256:$(sha256sum <"$tmp/listing" | cut -d' ' -f1)"

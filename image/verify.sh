#!/usr/bin/env bash
# image/verify.sh OUTDIR
#
# Checks an image built by image/build.sh, without changing it:
#  1. the digest of OUTDIR/rootfs, and the sha256 of every EROFS file,
#     equal the ones in OUTDIR/image.json;
#  2. in a chroot of a read-only bind of the rootfs (private mount namespace,
#     tmpfs /tmp and /home/sandbox, proc, a few device nodes), as the sandbox
#     uid/gid: node >= 22.19, pi --version, rg, fd, git, bash;
#  3. under gVisor (RUNSC, default bin/runsc beside this repo; skipped with a
#     note when absent): an OCI bundle with the read-only rootfs, the sandbox
#     uid, network none, tmpfs /tmp and home, a writable agent dir and
#     workspace: `pi --version`, then `pi --mode rpc` answering get_state,
#     get_commands, with pi-mcp-adapter loaded from the image (its `mcp`
#     command must be listed), and a bash command that writes the workspace
#     and runs git, rg and fd; the rootfs is then hashed again to prove no
#     check wrote to it.
# Root. Prints what each check saw; exits non-zero on the first failure.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
outdir=$(cd "${1:?usage: verify.sh OUTDIR}" && pwd -P)
json=$outdir/image.json
rootfs=$outdir/rootfs
runsc=${RUNSC:-$(dirname "$here")/bin/runsc}

die() { printf 'verify: FAIL: %s\n' "$*" >&2; exit 1; }
ok() { printf 'verify: ok: %s\n' "$*"; }
[[ $(id -u) == 0 ]] || die "run as root"
[[ -f $json && -d $rootfs ]] || die "$outdir has no image.json or rootfs"

field() { sed -n "s/^  \"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}\$/\1/p" "$json"; }
version=$(field version)
digest=$(field digest)
uid=$(field uid)
gid=$(field gid)
path=$(field path)
[[ -n $version && -n $digest && -n $uid && -n $gid && -n $path ]] || die "cannot read $json"

tmp=$(mktemp -d)
cleanup() {
	if [[ -n ${cid:-} ]]; then
		"$runsc" --root "$tmp/runsc" delete --force "$cid" >/dev/null 2>&1 || true
	fi
	# runsc leaves an nsfs mount under its root; the overlay root is ours.
	findmnt -rn -o TARGET | awk -v w="$tmp" 'index($0, w "/") == 1' | sort -r | while read -r m; do umount -l "$m" || true; done
	rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

# ---------------------------------------------------------------- 1. digest
got=$("$here/digest.sh" "$rootfs")
[[ $got == "$digest" ]] || die "digest of $rootfs is $got, image.json says $digest"
ok "digest $digest"
# The EROFS files (image.json "erofs": [{"dir", "file", "digest"}, …]).
while read -r file want; do
	got=sha256:$(sha256sum "$file" | cut -d' ' -f1)
	[[ $got == "$want" ]] || die "EROFS file $file is $got, image.json says $want"
	ok "EROFS $file $want"
done < <(grep -o '"dir": "[^"]*", "file": "[^"]*", "digest": "[^"]*"' "$json" | sed 's/"dir": "[^"]*", "file": "\([^"]*\)", "digest": "\([^"]*\)"/\1 \2/')
# The Pi bundle (image.json "bundle": {"file", "digest", …}), which
# /usr/local/bin/pi runs.
read -r bfile bwant < <(grep -o '"bundle": {"file": "[^"]*", "digest": "[^"]*"' "$json" | sed 's/"bundle": {"file": "\([^"]*\)", "digest": "\([^"]*\)"/\1 \2/') ||
	die "$json names no Pi bundle"
# Its digest covers the entries and chunks beside it (image/build.sh).
got=sha256:$(cd "$rootfs$(dirname "$bfile")" && find . -maxdepth 1 -type f \( -name pi.bundle.js -o -name 'pi.chunk-*.js' -o -name image-resize-worker.js \) -printf '%f\n' | sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
[[ $got == "$bwant" ]] || die "the Pi bundle $bfile (with its chunks) is $got, image.json says $bwant"
[[ $(readlink "$rootfs/usr/local/bin/pi") == "$bfile" ]] || die "/usr/local/bin/pi is not a link to the bundle $bfile"
[[ $(head -n 1 "$rootfs$bfile") == "#!/usr/local/bin/node --single-threaded" ]] || die "the bundle $bfile does not start with #!/usr/local/bin/node --single-threaded"
[[ -x $rootfs$bfile ]] || die "the bundle $bfile is not executable"
# ASCII, as image/pi/ascii.mjs keeps them: V8 reads them as one-byte strings.
nonascii=$(cd "$rootfs$(dirname "$bfile")" && LC_ALL=C grep -l -P '[^\x00-\x7F]' pi.bundle.js pi.chunk-*.js image-resize-worker.js) && die "not ASCII: $nonascii"
ok "Pi bundle $bfile $bwant"
# The adapter bundle (image.json "adapterBundle"), which the adapter's Pi
# manifest names instead of its index.ts.
read -r afile awant < <(grep -o '"adapterBundle": {"file": "[^"]*", "digest": "[^"]*"' "$json" | sed 's/"adapterBundle": {"file": "\([^"]*\)", "digest": "\([^"]*\)"/\1 \2/') ||
	die "$json names no adapter bundle"
got=sha256:$(sha256sum "$rootfs$afile" | cut -d' ' -f1)
[[ $got == "$awant" ]] || die "the adapter bundle $afile is $got, image.json says $awant"
grep -q "\"./$(basename "$afile")\"" "$rootfs$(dirname "$afile")/package.json" || die "pi-mcp-adapter's package.json does not name $afile"
nonascii=$(LC_ALL=C grep -l -P '[^\x00-\x7F]' "$rootfs$afile" "$rootfs"/opt/pi-jiti-seed/*) && die "not ASCII: $nonascii"
ok "adapter bundle $afile $awant"
# Pi's model catalogue (image.json "catalogue"), which the compiler embeds
# as policy/compiler/pi-catalogue.json (the Pi contract suite compares them).
read -r cfile cwant < <(grep -o '"catalogue": {"file": "[^"]*", "digest": "[^"]*"' "$json" | sed 's/"catalogue": {"file": "\([^"]*\)", "digest": "\([^"]*\)"/\1 \2/') ||
	die "$json names no model catalogue"
got=sha256:$(sha256sum "$rootfs$cfile" | cut -d' ' -f1)
[[ $got == "$cwant" ]] || die "the model catalogue $cfile is $got, image.json says $cwant"
ok "model catalogue $cfile $cwant"

# ---------------------------------------------------------------- 2. chroot
mkdir -p "$tmp/mnt"
# shellcheck disable=SC2016 # expanded by the inner shell
unshare -m --propagation private bash -euo pipefail -c '
	m=$1 rootfs=$2 uid=$3 gid=$4 path=$5
	mount --bind "$rootfs" "$m"
	mount -o remount,bind,ro "$m"
	mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$m/tmp"
	mount -t tmpfs -o mode=0700,uid=$uid,gid=$gid,nosuid,nodev tmpfs "$m/home/sandbox"
	mount -t proc -o nosuid,nodev,noexec proc "$m/proc"
	mount -t tmpfs -o mode=0755,nosuid tmpfs "$m/dev"
	for d in null zero full random urandom; do
		touch "$m/dev/$d"
		mount --bind "/dev/$d" "$m/dev/$d"
	done
	exec chroot --userspec="$uid:$gid" "$m" /usr/bin/env -i HOME=/home/sandbox PATH="$path" TMPDIR=/tmp \
		LANG=C.UTF-8 PI_OFFLINE=1 PI_CODING_AGENT_DIR=/tmp/pi-agent PI_CODING_AGENT_SESSION_DIR=/tmp/pi-sessions \
		/bin/bash -c "
			cd /home/sandbox
			echo \"id=\$(id -u):\$(id -g)\"
			echo \"node=\$(node --version)\"
			echo \"pi=\$(pi --version 2>&1)\"
			echo \"rg=\$(rg --version | head -n1)\"
			echo \"fd=\$(fd --version)\"
			echo \"git=\$(git --version)\"
			echo \"bash=\$(bash --version | head -n1)\"
			echo \"ca=\$(test -s /etc/ssl/certs/ca-certificates.crt && echo present)\"
			if touch /usr/local/bin/x 2>/dev/null; then echo rootfs=writable; else echo rootfs=read-only; fi
		"
' verify "$tmp/mnt" "$rootfs" "$uid" "$gid" "$path" >"$tmp/chroot.out" 2>&1 || {
	cat "$tmp/chroot.out" >&2
	die "chroot checks failed"
}
sed 's/^/verify:   chroot /' "$tmp/chroot.out"
get() { sed -n "s/^$1=//p" "$tmp/chroot.out"; }
[[ $(get id) == "$uid:$gid" ]] || die "chroot ran as $(get id)"
node_v=$(get node)
IFS=. read -r maj min _ <<<"${node_v#v}"
((maj > 22 || (maj == 22 && min >= 19))) || die "node $node_v < 22.19"
[[ $node_v == "v$NODE_VERSION" ]] || die "node $node_v, pinned $NODE_VERSION"
[[ $(get pi) == *"$PI_VERSION"* ]] || die "pi --version printed '$(get pi)'"
[[ $(get rg) == ripgrep* ]] || die "rg: $(get rg)"
[[ $(get fd) == fd* ]] || die "fd: $(get fd)"
[[ $(get git) == "git version"* ]] || die "git: $(get git)"
[[ $(get bash) == "GNU bash"* ]] || die "bash: $(get bash)"
[[ $(get ca) == present ]] || die "no CA bundle"
[[ $(get rootfs) == read-only ]] || die "the rootfs was writable in the check"
ok "chroot as $uid:$gid: node $node_v, pi $(get pi), $(get rg), $(get fd), $(get git)"

# ---------------------------------------------------------------- 3. gVisor
if [[ ! -x $runsc ]]; then
	echo "verify: skip: no runsc at $runsc (make runsc builds it)"
	exit 0
fi
mkdir -p "$tmp/bundle" "$tmp/runsc" "$tmp/agent" "$tmp/workspace" "$tmp/upper" "$tmp/ovlwork" "$tmp/root"
# runsc creates missing bind-mount points (here /workspace/project) in the
# host directory behind root.path, read-only root or not, and fails when it
# cannot. So the sandbox root is a private overlay whose upper layer takes
# those directories, and the image itself is never written.
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$tmp/upper,workdir=$tmp/ovlwork" "$tmp/root"
chown "$uid:$gid" "$tmp/agent" "$tmp/workspace"
chmod 0700 "$tmp/agent" "$tmp/workspace"
# A custom provider so RPC has a model with a credential (nothing is called:
# a loopback discard port, and network none), and the adapter as a local
# package from the image.
cat >"$tmp/agent/models.json" <<'EOF'
{"providers":{"fake":{"baseUrl":"http://127.0.0.1:9/v1","api":"openai-completions","apiKey":"$FAKE_LLM_KEY","compat":{"supportsDeveloperRole":false},"models":[{"id":"fake-1","input":["text"],"contextWindow":128000,"maxTokens":16384}]}}}
EOF
echo '{"packages":["/opt/pi/node_modules/pi-mcp-adapter"]}' >"$tmp/agent/settings.json"
chown "$uid:$gid" "$tmp/agent/models.json" "$tmp/agent/settings.json"
chmod 0600 "$tmp/agent/models.json" "$tmp/agent/settings.json"

# bundle ARGS_JSON: writes config.json for one run.
bundle() {
	cat >"$tmp/bundle/config.json" <<EOF
{
  "ociVersion": "1.0.2",
  "root": {"path": "$tmp/root", "readonly": true},
  "hostname": "paseo-sandbox",
  "process": {
    "terminal": false,
    "user": {"uid": $uid, "gid": $gid},
    "args": $1,
    "env": ["HOME=/home/sandbox", "PATH=$path", "TMPDIR=/tmp", "LANG=C.UTF-8", "PI_OFFLINE=1",
            "PI_CODING_AGENT_DIR=/state/pi-agent", "PI_CODING_AGENT_SESSION_DIR=/state/pi-sessions",
            "FAKE_LLM_KEY=not-a-secret"],
    "cwd": "/workspace/project",
    "capabilities": {},
    "noNewPrivileges": true
  },
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", "size=268435456"]},
    {"destination": "/home/sandbox", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=0700", "uid=$uid", "gid=$gid", "size=268435456"]},
    {"destination": "/state/pi-agent", "type": "bind", "source": "$tmp/agent", "options": ["bind", "rw", "nosuid", "nodev"]},
    {"destination": "/state/pi-sessions", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=0700", "uid=$uid", "gid=$gid"]},
    {"destination": "/workspace/project", "type": "bind", "source": "$tmp/workspace", "options": ["bind", "rw", "nosuid", "nodev"]}
  ],
  "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}]}
}
EOF
}
n=0
# run_sandbox STDIN STDOUT STDERR: one runsc run of the current bundle.
run_sandbox() {
	n=$((n + 1))
	cid=paseo-image-verify-$$-$n
	timeout 120 "$runsc" --root "$tmp/runsc" --network=none --directfs=false \
		run --bundle "$tmp/bundle" "$cid" <"$1" >"$2" 2>"$3"
}

bundle '["/usr/local/bin/pi", "--version"]'
: >"$tmp/empty"
start=$(date +%s%N)
run_sandbox "$tmp/empty" "$tmp/version.out" "$tmp/version.err" || {
	cat "$tmp/version.err" >&2
	die "pi --version under runsc failed"
}
ms=$((($(date +%s%N) - start) / 1000000))
pi_v=$(cat "$tmp/version.out" "$tmp/version.err" | tr -d '\r' | head -n1)
[[ $pi_v == *"$PI_VERSION"* ]] || die "pi --version under runsc printed '$pi_v'"
ok "runsc: pi --version printed '$pi_v' (${ms} ms, sandbox start included)"

# RPC: keep stdin open until all responses are in, then close it (EOF ends Pi).
bundle '["/usr/local/bin/pi", "--mode", "rpc", "--model", "fake/fake-1", "--no-session"]'
mkfifo "$tmp/rpc.in"
start=$(date +%s%N)
run_sandbox "$tmp/rpc.in" "$tmp/rpc.out" "$tmp/rpc.err" &
runner=$!
exec 3>"$tmp/rpc.in"
printf '%s\n' '{"id":"req_1","type":"get_state"}' '{"id":"req_2","type":"get_commands"}' \
	'{"id":"req_3","type":"bash","command":"id -u; echo ok >written-by-pi && git init -q . && git add written-by-pi && rg -l ok && fd written && pwd"}' >&3
for _ in $(seq 1 600); do
	if grep -q '"id":"req_3","type":"response"' "$tmp/rpc.out" 2>/dev/null || ! kill -0 "$runner" 2>/dev/null; then
		break
	fi
	sleep 0.1
done
exec 3>&-
rc=0
wait "$runner" || rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
echo "verify:   rpc exit $rc after ${ms} ms; stdout:"
sed 's/^/verify:     /' "$tmp/rpc.out" | cut -c1-1200
if [[ -s $tmp/rpc.err ]]; then
	echo "verify:   rpc stderr:"
	sed 's/^/verify:     /' "$tmp/rpc.err" | head -n 40
fi
grep -q '"command":"get_state","success":true' "$tmp/rpc.out" || die "no successful get_state response"
grep -q '"name":"mcp"' "$tmp/rpc.out" || die "get_commands does not list the adapter's mcp command"
grep '"id":"req_3","type":"response"' "$tmp/rpc.out" | grep -q '"exitCode":0' || die "Pi's bash command failed in the workspace"
[[ $(stat -c %u "$tmp/workspace/written-by-pi" 2>/dev/null) == "$uid" ]] || die "no file written by uid $uid in the workspace"
ok "runsc: pi --mode rpc answered get_state, get_commands (adapter's mcp command listed) and bash (git, rg, fd; wrote the workspace as $uid)"
[[ $(find "$tmp/agent" -mindepth 1 | wc -l) -ge 2 ]] && echo "verify:   agent dir after the run: $(cd "$tmp/agent" && find . -mindepth 1 | sort | tr '\n' ' ')"
upper=$(cd "$tmp/upper" && find . -mindepth 1 | sort | tr '\n' ' ')
echo "verify:   written to the overlay's upper layer by runsc: ${upper:-nothing}"

got=$("$here/digest.sh" "$rootfs")
[[ $got == "$digest" ]] || die "the checks changed the rootfs: digest now $got"
ok "rootfs unchanged after the checks ($digest)"

package bundle

import (
	"strconv"
	"strings"
)

// FSMonitorHookFile is the workspace monitor's core.fsmonitor hook, when
// the plan grants the monitor (grant.FSMonitor): bound read-only, and
// executable, at FSMonitorHookPath in the sandbox.
const (
	FSMonitorHookFile = "files/fsmonitor-hook"
	FSMonitorHookPath = "/run/paseo/fsmonitor/hook"
	// FSMonitorIndexFile is the index the sandbox's git starts from when
	// the launcher vouched for the workspace (runtime/launcher/fsmonitor/
	// vouch): compiled empty, bound read-only at FSMonitorIndexPath, and
	// written into the run dir's copy by the launcher before runsc starts.
	// The pi-session start script copies it in place of the seed's index
	// when it is a non-empty regular file, and the seed's index otherwise.
	FSMonitorIndexFile = "files/fsmonitor-index"
	FSMonitorIndexPath = "/run/paseo/fsmonitor/index"
	// GitSeedPath is where a private Git dir's layout shows the
	// worktree's real Git dir, read-only, for the start script to seed
	// from (PASEO_GIT_SEED): the launcher's vouch reads its index there.
	GitSeedPath = "/run/paseo/git-seed"
	// GatewayName is the host name the sandbox reaches its gateway by
	// (egress.json's Gateway): the launcher pins it in /etc/hosts, since
	// the address is leased only at launch.
	GatewayName = "paseo-gateway"
)

// FSMonitorHook returns the hook (Git's fsmonitor protocol 2): Perl, the
// smallest real client in the image (perl-base, with its built-in socket
// calls only: loading Socket's XS cost about 30 ms of each call under
// gVisor; no binary added to the image). It
// connects over TCP to host:port (in a bundle, the gateway's name, which
// the launcher pins in /etc/hosts, and the grant's port), sends
// "since TOKEN", half-closes and copies the answer to stdout. Any failure
// (nothing listening, a refused request, an empty answer, ten seconds
// without one) exits non-zero with nothing on stdout: Git then scans as
// it would without a monitor.
//
// The names the watcher answers are relative to the workspace, so the hook
// answers only for the worktree that is the workspace: Git runs it in the
// worktree's top directory, and for any other repository (one the agent
// cloned beneath the workspace or made in /tmp) it exits non-zero, the
// same full scan, rather than hand Git names of another tree.
func FSMonitorHook(host string, port int, worktree string) []byte {
	return []byte(`#!/usr/bin/perl
alarm 10;
my ($v, $t) = @ARGV;
exit 1 unless defined $t && $v eq "2";
my @here = stat(".");
my @ws = stat(` + perlQuote(worktree) + `);
exit 1 unless @here && @ws && $here[0] == $ws[0] && $here[1] == $ws[1];
my $ip = (gethostbyname(` + perlQuote(host) + `))[4] or exit 1;
socket(my $s, 2, 1, 0) or exit 1;
connect($s, pack('S n a4 x8', 2, ` + strconv.Itoa(port) + `, $ip)) or exit 1;
syswrite($s, "since $t\n") or exit 1;
shutdown($s, 1);
my ($r, $b) = ("", "");
while (sysread($s, $b, 65536)) { $r .= $b }
exit 1 unless length $r;
binmode STDOUT;
print $r;
`)
}

// perlQuote is s as a Perl single-quoted string.
func perlQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

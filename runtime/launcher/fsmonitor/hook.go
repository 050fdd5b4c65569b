package fsmonitor

import (
	"net/netip"
	"strconv"
	"strings"
)

// Dir and HookPath are where the launcher puts the hook in the sandbox (a
// read-only directory bind).
const (
	Dir      = "/run/paseo/fsmonitor"
	HookPath = Dir + "/hook"
)

// HookFor returns the sandbox's core.fsmonitor hook (protocol 2): Perl, the
// smallest real client in the image (perl-base's Socket, which Git's own
// fsmonitor-watchman sample uses too; no binary added to the image). It
// connects over TCP to addr (the sandbox network's gateway, where the
// launcher serves the monitor as it serves the private routes), sends
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
func HookFor(addr netip.AddrPort, worktree string) string {
	return `#!/usr/bin/perl
use Socket;
alarm 10;
my ($v, $t) = @ARGV;
exit 1 unless defined $t && $v eq "2";
my @here = stat(".");
my @ws = stat(` + perlQuote(worktree) + `);
exit 1 unless @here && @ws && $here[0] == $ws[0] && $here[1] == $ws[1];
socket(my $s, AF_INET, SOCK_STREAM, 0) or exit 1;
connect($s, pack_sockaddr_in(` + strconv.Itoa(int(addr.Port())) + `, inet_aton(` + perlQuote(addr.Addr().String()) + `))) or exit 1;
syswrite($s, "since $t\n") or exit 1;
shutdown($s, 1);
my ($r, $b) = ("", "");
while (sysread($s, $b, 65536)) { $r .= $b }
exit 1 unless length $r;
binmode STDOUT;
print $r;
`
}

// perlQuote is s as a Perl single-quoted string.
func perlQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

package fsmonitor

// SocketPath and HookPath are where the launcher puts the socket and the
// hook in the sandbox (one read-only directory bind).
const (
	Dir        = "/run/paseo/fsmonitor"
	SocketPath = Dir + "/sock"
	HookPath   = Dir + "/hook"
)

// Hook is the sandbox's core.fsmonitor hook (protocol 2): Perl, the
// smallest real client in the image (perl-base's Socket, which Git's own
// fsmonitor-watchman sample uses too; no binary added to the image). It
// sends "since TOKEN", half-closes and copies the answer to stdout. Any
// failure (no socket, a refused request, an empty answer, ten seconds
// without one) exits non-zero with nothing on stdout: Git then scans as it
// would without a monitor.
var Hook = HookFor(SocketPath)

// HookFor is the hook asking the socket at sock.
func HookFor(sock string) string {
	return `#!/usr/bin/perl
use Socket;
alarm 10;
my ($v, $t) = @ARGV;
exit 1 unless defined $t && $v eq "2";
socket(my $s, AF_UNIX, SOCK_STREAM, 0) or exit 1;
connect($s, pack_sockaddr_un("` + sock + `")) or exit 1;
syswrite($s, "since $t\n") or exit 1;
shutdown($s, 1);
my ($r, $b) = ("", "");
while (sysread($s, $b, 65536)) { $r .= $b }
exit 1 unless length $r;
binmode STDOUT;
print $r;
`
}

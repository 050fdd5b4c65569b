package bundle

import (
	"slices"
	"strconv"
	"strings"
)

// The native search's client (grant search workspace; docs/spec.md,
// "Read-only searches answered outside gVisor"): when the plan grants the
// search, the compiler writes SearchClientFile, binds it read-only and
// executable at SearchDir/<name> for each of SearchClientNames, and puts
// SearchDir first on the process's PATH, so the sandbox's `rg` (a shell's,
// Pi's grep tool's) is the client. It is one script that answers under
// each of those names (it takes its own name from $0); whatever it does
// not forward runs the image's own program in the sandbox, as before.
const (
	SearchClientFile = "files/search-client"
	SearchDir        = "/run/paseo/search"
	// SearchRealRg is the sandbox's own rg, which the client runs for
	// anything it does not forward.
	SearchRealRg = "/usr/bin/rg"
)

// SearchClientNames are the names the client is installed under in
// SearchDir: the one list the compiler binds, ocicheck checks and the
// client answers.
var SearchClientNames = []string{"rg"}

// SearchValue is the kind of value one of the search's options takes.
type SearchValue string

const (
	SearchFlag   SearchValue = ""       // none
	SearchText   SearchValue = "text"   // any text up to 4 KiB without NUL
	SearchNumber SearchValue = "number" // a decimal count
	SearchType   SearchValue = "type"   // one of rg's file type names
)

// SearchOptions is the closed list of rg's long options a request may
// carry, each with the kind of value it takes: the client forwards only
// these, and the server (runtime/launcher/nativesearch) admits only these,
// checking each value by its kind. None runs anything, follows a link,
// reads a file the request names apart from the paths, or writes.
var SearchOptions = map[string]SearchValue{
	"ignore-case": SearchFlag, "case-sensitive": SearchFlag, "smart-case": SearchFlag,
	"fixed-strings": SearchFlag, "word-regexp": SearchFlag, "line-regexp": SearchFlag, "invert-match": SearchFlag,
	"count": SearchFlag, "count-matches": SearchFlag, "files-with-matches": SearchFlag, "files-without-match": SearchFlag, "files": SearchFlag,
	"line-number": SearchFlag, "no-line-number": SearchFlag, "column": SearchFlag, "no-heading": SearchFlag, "heading": SearchFlag,
	"with-filename": SearchFlag, "no-filename": SearchFlag, "only-matching": SearchFlag, "vimgrep": SearchFlag, "json": SearchFlag,
	"hidden": SearchFlag, "no-ignore": SearchFlag, "no-ignore-vcs": SearchFlag, "no-config": SearchFlag, "null": SearchFlag,
	"color=never": SearchFlag, "multiline": SearchFlag, "trim": SearchFlag, "byte-offset": SearchFlag, "sort=path": SearchFlag,
	"no-messages": SearchFlag, "quiet": SearchFlag, "stats": SearchFlag,

	"glob": SearchText, "iglob": SearchText, "regexp": SearchText, "replace": SearchText,
	"type": SearchType, "type-not": SearchType,
	"context": SearchNumber, "after-context": SearchNumber, "before-context": SearchNumber,
	"max-count": SearchNumber, "max-depth": SearchNumber, "max-columns": SearchNumber,
}

// SearchClient returns the client for a search served at host:port (in a
// bundle, the gateway's name, which the launcher pins in /etc/hosts, and
// the grant's port) for the workspace ws: Perl (the image's perl-base, as
// the workspace monitor's hook; no binary added to the image). It turns
// argv into a typed request when every option is on the list, the cwd
// lies beneath ws and every path is a plain name there; stdout is not a
// terminal and rg would not read stdin; and RIPGREP_CONFIG_PATH is unset
// or --no-config given. It prints the answer and exits with rg's code.
// Anything else, and any failure or "fallback" answer, execs the
// sandbox's own rg with the same argv: the same output, only slower.
func SearchClient(host string, port int, ws string) []byte {
	return SearchClientFor(host, port, ws, SearchRealRg)
}

// SearchClientFor is SearchClient falling back to realRg instead of the
// image's (tests run the client on the host).
func SearchClientFor(host string, port int, ws, realRg string) []byte {
	var flags, valued []string
	for k, v := range SearchOptions {
		if v == SearchFlag {
			flags = append(flags, perlQuote(k))
		} else {
			valued = append(valued, perlQuote(k))
		}
	}
	slices.Sort(flags)
	slices.Sort(valued)
	return []byte(`#!/usr/bin/perl
use strict;
use Socket;
use Cwd ();
my $ws = ` + perlQuote(ws) + `;
my @argv = @ARGV;
sub real { exec {` + perlQuote(realRg) + `} 'rg', @argv; exit 2 }
my %flag = map { $_ => 1 } (` + strings.Join(flags, ", ") + `);
my %valued = map { $_ => 1 } (` + strings.Join(valued, ", ") + `);
my %short = ('i','ignore-case','s','case-sensitive','S','smart-case','F','fixed-strings','w','word-regexp',
  'x','line-regexp','v','invert-match','c','count','l','files-with-matches','n','line-number','N','no-line-number',
  'H','with-filename','I','no-filename','o','only-matching','0','null','.','hidden','q','quiet',
  'g','glob','e','regexp','t','type','T','type-not','C','context','A','after-context','B','before-context',
  'm','max-count','r','replace','M','max-columns');
my (@opts, @pos, $noconfig, $pats, $files);
my $i = 0;
sub opt {
  my ($n, $v) = @_;
  if ($n eq 'color' || $n eq 'sort') { real() unless defined $v; $n = "$n=$v"; $v = undef }
  if ($flag{$n}) { real() if defined $v; push @opts, $n; $noconfig = 1 if $n eq 'no-config'; $files = 1 if $n eq 'files'; return }
  real() unless $valued{$n};
  if (!defined $v) { real() if $i > $#argv; $v = $argv[$i++] }
  $pats++ if $n eq 'regexp';
  push @opts, [$n, $v];
}
while ($i <= $#argv) {
  my $a = $argv[$i++];
  if ($a eq '--') { push @pos, @argv[$i .. $#argv]; last }
  if ($a =~ /^--([a-z0-9-]+)(?:=(.*))?$/s) {
    my ($n, $v) = ($1, $2);
    $v = $argv[$i++] if !defined $v && ($n eq 'color' || $n eq 'sort') && $i <= $#argv;
    opt($n, $v); next;
  }
  if ($a =~ /^-(.+)$/s) {
    my @c = split //, $1;
    while (@c) {
      my $n = $short{shift @c} // real();
      if ($valued{$n}) { my $rest = join '', @c; opt($n, length $rest ? $rest : undef); last }
      opt($n);
    }
    next;
  }
  push @pos, $a;
}
real() if -t STDOUT;
real() if defined $ENV{RIPGREP_CONFIG_PATH} && !$noconfig;
my $pattern;
$pattern = shift @pos unless $pats || $files;
real() unless defined $pattern || $pats || $files;
real() if !@pos && (-p STDIN || -f STDIN || -S STDIN);
my $cwd = Cwd::getcwd() // real();
my $rel;
if ($cwd eq $ws) { $rel = '.' } elsif (index($cwd, "$ws/") == 0) { $rel = substr($cwd, length($ws) + 1) } else { real() }
my $req = "paseo-search 1\0cwd\0$rel\0";
for my $o (@opts) {
  if (ref $o) { $req .= "opt\0$o->[0]\0val\0$o->[1]\0" } else { $req .= "opt\0$o\0" }
}
$req .= "pattern\0$pattern\0" if defined $pattern;
$req .= "path\0$_\0" for @pos;
$SIG{ALRM} = \&real;
alarm 90;
socket(my $s, AF_INET, SOCK_STREAM, 0) or real();
my $ip = inet_aton(` + perlQuote(host) + `) or real();
connect($s, pack_sockaddr_in(` + strconv.Itoa(port) + `, $ip)) or real();
my $off = 0;
while ($off < length $req) { my $n = syswrite($s, $req, 65536, $off) or real(); $off += $n }
shutdown($s, 1);
my ($r, $b) = ('', '');
while (1) { my $n = sysread($s, $b, 1 << 20); real() unless defined $n; last unless $n; $r .= $b }
alarm 0;
my ($exit, $no, $ne) = $r =~ /\Apaseo-search 1 ok (\d) (\d+) (\d+)\n/ or real();
my $h = $+[0];
real() unless length($r) == $h + $no + $ne;
binmode STDOUT; binmode STDERR;
# rg ends quietly with 0 when its reader goes away (head): so does this.
$SIG{PIPE} = 'IGNORE';
my $out = substr($r, $h, $no);
$off = 0;
while ($off < length $out) {
  my $n = syswrite(STDOUT, $out, 1 << 16, $off);
  exit 0 if !defined $n && $!{EPIPE};
  exit 2 unless defined $n;
  $off += $n;
}
print STDERR substr($r, $h + $no, $ne);
exit $exit;
`)
}

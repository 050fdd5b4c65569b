package nativesearch

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Dir is where the launcher binds the client into the sandbox (read-only);
// the process's PATH starts with it, so `rg`, `fd` and `find` (a shell's,
// Pi's grep and find tools') are the client.
const (
	Dir        = "/run/paseo/search"
	ClientPath = Dir + "/rg"
	// RealRg is the sandbox's own rg, which the client runs for anything
	// it does not forward.
	RealRg = "/usr/bin/rg"
)

// Names are the names the client is installed under in Dir, each the same
// script, which dispatches on its own name: the one list of the tools
// answered outside.
var Names = []string{"rg", "fd", "find"}

// Real are the sandbox's own binaries the client runs, by name, for
// anything it does not forward: what the sandbox's PATH
// (/usr/local/bin:/usr/bin:/bin) finds without the client.
var Real = map[string]string{"rg": RealRg, "fd": "/usr/local/bin/fd", "find": "/usr/bin/find"}

// Client returns the sandbox's search client: Perl (the image's
// perl-base, as the workspace monitor's hook; no binary added to the
// image), one script for every name in Names, acting as the tool it is
// named. It turns argv into a typed request when every option (find: every
// test and action) is on the tool's list, the cwd lies beneath the
// workspace ws and every path is a plain name there; for rg and fd,
// stdout is not a terminal and no global ignore file of the user's is
// there (the jail has no HOME); for rg, rg would not read stdin and
// RIPGREP_CONFIG_PATH is unset or --no-config given; for find, the locale
// is a C locale (sent along) and POSIXLY_CORRECT unset. It prints the
// answer and exits with the tool's code. Anything else, and any failure or
// "fallback" answer, execs the sandbox's own binary (Real) with the same
// argv: the same output, only slower.
func Client(addr netip.AddrPort, ws string) string { return client(addr, ws, Real) }

// client is Client with the binaries it falls back to (tests run it on
// the host with the image's).
func client(addr netip.AddrPort, ws string, real map[string]string) string {
	var reals []string
	for _, n := range Names {
		reals = append(reals, perlQuote(n), perlQuote(real[n]))
	}
	var noarg, witharg, langs []string
	for k, p := range Primaries {
		if p.Arg == nil {
			noarg = append(noarg, k)
		} else {
			witharg = append(witharg, k)
		}
	}
	for k := range Langs {
		langs = append(langs, k)
	}
	return `#!/usr/bin/perl
use strict;
use Socket;
use Cwd ();
my $ws = ` + perlQuote(ws) + `;
my @argv = @ARGV;
my %real = (` + strings.Join(reals, ", ") + `);
my ($tool) = $0 =~ m{([^/]*)\z};
die "paseo search client: not installed as one of ` + strings.Join(Names, ", ") + `\n" unless defined $tool && $real{$tool};
sub real { exec {$real{$tool}} $tool, @argv; exit 2 }
my %flag = map { $_ => 1 } ($tool eq 'rg' ? (` + keys(Flags) + `) : (` + keys(FdFlags) + `));
my %valued = map { $_ => 1 } ($tool eq 'rg' ? (` + keys(Valued) + `) : (` + keys(FdValued) + `));
my %short = $tool eq 'rg' ? ('i','ignore-case','s','case-sensitive','S','smart-case','F','fixed-strings','w','word-regexp',
  'x','line-regexp','v','invert-match','c','count','l','files-with-matches','n','line-number','N','no-line-number',
  'H','with-filename','I','no-filename','o','only-matching','0','null','.','hidden','q','quiet',
  'g','glob','e','regexp','t','type','T','type-not','C','context','A','after-context','B','before-context',
  'm','max-count','r','replace','M','max-columns')
  : ('H','hidden','I','no-ignore','u','unrestricted','s','case-sensitive','i','ignore-case','g','glob',
  'F','fixed-strings','a','absolute-path','p','full-path','0','print0','q','quiet',
  'd','max-depth','t','type','e','extension','E','exclude','S','size');
my %eqflag = $tool eq 'rg' ? ('color', 1, 'sort', 1) : ('color', 1);
my %noarg = map { $_ => 1 } (` + quoted(noarg) + `);
my %witharg = map { $_ => 1 } (` + quoted(witharg) + `);
my %langs = map { $_ => 1 } (` + quoted(langs) + `);
my (@opts, @pos, @expr, $noconfig, $pats, $files, $lang);
my $i = 0;
sub opt {
  my ($n, $v) = @_;
  if ($eqflag{$n}) { real() unless defined $v; $n = "$n=$v"; $v = undef }
  if ($flag{$n}) { real() if defined $v; push @opts, $n; $noconfig = 1 if $n eq 'no-config'; $files = 1 if $n eq 'files'; return }
  real() unless $valued{$n};
  if (!defined $v) { real() if $i > $#argv; $v = $argv[$i++] }
  $pats++ if $n eq 'regexp';
  push @opts, [$n, $v];
}
if ($tool eq 'find') {
  # find's words: -P (the default: links never followed), the starting
  # points up to the first word that reads as an expression, then the
  # expression, each test's value taken as find takes it.
  real() if defined $ENV{POSIXLY_CORRECT} || defined $ENV{LANGUAGE};
  real() if grep { /^LC_/ && $_ ne 'LC_ALL' && length $ENV{$_} } keys %ENV;
  $lang = defined $ENV{LC_ALL} && length $ENV{LC_ALL} ? $ENV{LC_ALL} : $ENV{LANG} // '';
  real() unless $lang eq '' || $langs{$lang};
  $i++ while $i <= $#argv && $argv[$i] eq '-P';
  push @pos, $argv[$i++] while $i <= $#argv && !($argv[$i] =~ /^-./s || $argv[$i] =~ /^[()!,]\z/);
  @expr = @argv[$i .. $#argv];
  for (my $k = 0; $k <= $#expr; $k++) {
    my $t = $expr[$k];
    next if $t =~ /^(?:[()!]|-not|-a|-and|-o|-or)\z/ || $noarg{$t};
    real() unless $witharg{$t} && $k < $#expr;
    $k++;
  }
} else {
  while ($i <= $#argv) {
    my $a = $argv[$i++];
    if ($a eq '--') { push @pos, @argv[$i .. $#argv]; last }
    if ($a =~ /^--([a-z0-9-]+)(?:=(.*))?$/s) {
      my ($n, $v) = ($1, $2);
      $v = $argv[$i++] if !defined $v && $eqflag{$n} && $i <= $#argv;
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
  # The user's global ignore files (Git's, fd's): the jail has no HOME.
  real() unless defined $ENV{HOME};
  my @cfg = ("$ENV{HOME}/.gitconfig");
  for my $d ("$ENV{HOME}/.config", defined $ENV{XDG_CONFIG_HOME} ? $ENV{XDG_CONFIG_HOME} : ()) {
    push @cfg, "$d/git/config", "$d/git/ignore", "$d/fd/ignore";
  }
  for my $f (@cfg) { real() if -e $f }
}
my $pattern;
if ($tool eq 'rg') {
  real() if defined $ENV{RIPGREP_CONFIG_PATH} && !$noconfig;
  $pattern = shift @pos unless $pats || $files;
  real() unless defined $pattern || $pats || $files;
  real() if !@pos && (-p STDIN || -f STDIN || -S STDIN);
} elsif ($tool eq 'fd') {
  $pattern = shift @pos;
}
my $cwd = Cwd::getcwd() // real();
my $rel;
if ($cwd eq $ws) { $rel = '.' } elsif (index($cwd, "$ws/") == 0) { $rel = substr($cwd, length($ws) + 1) } else { real() }
my $req = "paseo-search 1\0tool\0$tool\0cwd\0$rel\0";
for my $o (@opts) {
  if (ref $o) { $req .= "opt\0$o->[0]\0val\0$o->[1]\0" } else { $req .= "opt\0$o\0" }
}
$req .= "pattern\0$pattern\0" if defined $pattern;
$req .= "path\0$_\0" for @pos;
$req .= "expr\0$_\0" for @expr;
$req .= "lang\0$lang\0" if defined $lang && length $lang;
$SIG{ALRM} = \&real;
alarm 90;
socket(my $s, AF_INET, SOCK_STREAM, 0) or real();
connect($s, pack_sockaddr_in(` + strconv.Itoa(int(addr.Port())) + `, inet_aton(` + perlQuote(addr.Addr().String()) + `))) or real();
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
# rg and fd end quietly with 0 when their reader goes away (head): so
# does this; find is ended by SIGPIPE (as it inherited it), so is this.
$SIG{PIPE} = 'IGNORE' unless $tool eq 'find';
my $out = substr($r, $h, $no);
$off = 0;
while ($off < length $out) {
  my $n = syswrite(STDOUT, $out, 1 << 16, $off);
  exit 0 if !defined $n && $!{EPIPE} && $tool ne 'find';
  exit($tool eq 'rg' ? 2 : 1) unless defined $n;
  $off += $n;
}
print STDERR substr($r, $h + $no, $ne);
exit $exit;
`
}

// keys are m's keys, sorted, as a Perl list.
func keys[V any](m map[string]V) string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return quoted(k)
}

// quoted is s sorted, as a Perl list.
func quoted(s []string) string {
	s = slices.Clone(s)
	slices.Sort(s)
	for i := range s {
		s[i] = perlQuote(s[i])
	}
	return strings.Join(s, ", ")
}

// perlQuote is s as a Perl single-quoted string.
func perlQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

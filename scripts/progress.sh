# shellcheck shell=bash
# scripts/progress.sh, sourced by the long builds (tools/runsc/build.sh,
# image/build.sh): what they are doing and how far along, on stderr.
#
#   progress_init LABEL TOTAL        a build of TOTAL steps
#   progress_step WHAT               "[LABEL n/TOTAL +Ts] WHAT", the next step
#   progress_note WHAT               the same line, without advancing
#   progress_run WHAT [--log FILE] -- CMD...
#                                    a step whose CMD runs quietly: every
#                                    PASEO_PROGRESS_TICK seconds (15) a
#                                    "still WHAT (Ts)" line, ending with FILE's
#                                    last line when given (what CMD logs there)
#   progress_count TOTAL WHAT        a filter for `go build -v` stderr: counts
#                                    the package lines ("k/TOTAL WHAT" every
#                                    tenth of TOTAL), passes every other line
#   progress_done WHAT               "[LABEL done +Ts] WHAT"
#
# T is seconds since progress_init. Only bash builtins and date; no output on
# stdout, which the builds keep for their result.

progress_init() {
	_progress_label=$1
	_progress_total=$2
	_progress_n=0
	_progress_start=$(date +%s)
}

_progress_elapsed() { echo $(($(date +%s) - _progress_start)); }

progress_note() {
	printf '[%s %d/%d +%ds] %s\n' "$_progress_label" "$_progress_n" "$_progress_total" "$(_progress_elapsed)" "$*" >&2
}

progress_step() {
	_progress_n=$((_progress_n + 1))
	progress_note "$@"
}

progress_done() {
	printf '[%s done +%ds] %s\n' "$_progress_label" "$(_progress_elapsed)" "$*" >&2
}

progress_run() {
	local what=$1 log= rc=0 ticker step_start
	shift
	if [[ ${1:-} == --log ]]; then
		log=$2
		shift 2
	fi
	[[ ${1:-} == -- ]] && shift
	progress_step "$what"
	step_start=$(date +%s)
	# The ticker ends with this shell: it checks the shell is alive ($$ is
	# the parent's pid in a subshell) before each line, so a build that
	# dies leaves no stray printer behind.
	(
		trap 'exit 0' TERM
		while sleep "${PASEO_PROGRESS_TICK:-15}"; do
			kill -0 $$ 2>/dev/null || exit 0
			local status=""
			if [[ -n $log && -s $log ]]; then
				status=$(tail -n 1 -- "$log" | tr -d '\r' | cut -c1-60)
				status=${status:+: $status}
			fi
			progress_note "still $what ($(($(date +%s) - step_start))s)$status"
		done
	) &
	ticker=$!
	"$@" || rc=$?
	kill "$ticker" 2>/dev/null || true
	wait "$ticker" 2>/dev/null || true
	return "$rc"
}

progress_count() {
	local total=$1 what=$2 line k=0 every
	every=$((total / 10))
	((every > 0)) || every=1
	while IFS= read -r line; do
		# `go build -v` names each package it compiles, one import path a
		# line; anything else (errors) passes through.
		if [[ $line =~ ^[A-Za-z0-9._~/-]+$ ]]; then
			k=$((k + 1))
			((k % every == 0)) && progress_note "$k/$total $what"
		else
			printf '%s\n' "$line" >&2
		fi
	done
	progress_note "$k/$total $what (done; the rest were cached)"
}

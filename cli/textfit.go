package cli

import (
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// defaultWidth is the width of text output that goes to no terminal (a pipe,
// a file, CI logs) and has no COLUMNS: what an ordinary terminal shows
// without wrapping.
const defaultWidth = 100

// minWidth keeps a tiny COLUMNS or window from squeezing columns to nothing
// (explain's table needs 45); narrower than this, lines overflow rather
// than become unreadable.
const minWidth = 50

// outputWidth is the width text output must fit: COLUMNS when it is a
// positive number (the shell's, or the caller's choice), else the width of
// the terminal stdout is, else defaultWidth.
func outputWidth(stdout io.Writer) int {
	w := defaultWidth
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		w = n
	} else if f, ok := stdout.(interface{ Fd() uintptr }); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
			w = int(ws.Col)
		}
	}
	return max(w, minWidth)
}

// textWidth counts runes: every value explain and diff print is a path,
// name, number or ASCII sentence, none of them double-width.
func textWidth(s string) int { return utf8.RuneCountInString(s) }

// wrap breaks s into lines of at most width runes, at spaces where it can;
// a word longer than a line is broken after its last '/', ',', '=', ':' or
// '-' that fits (a path stays readable), else at the width. Nothing is dropped
// but the spaces at the breaks: within a line, spacing is kept (aligned
// fields stay aligned).
func wrap(s string, width int) []string { return wrapHanging(s, width, width) }

// wrapHanging is wrap with a first line of first runes and the rest of rest.
func wrapHanging(s string, first, rest int) []string {
	first, rest = max(first, 1), max(rest, 1)
	if textWidth(s) <= first {
		return []string{s}
	}
	var lines []string
	line := ""
	limit := func() int {
		if len(lines) == 0 {
			return first
		}
		return rest
	}
	for _, tk := range tokens(s) {
		word, space := tk.word, tk.space
		if line == "" {
			space = ""
		}
		for textWidth(line)+textWidth(space)+textWidth(word) > limit() {
			room := limit() - textWidth(line) - textWidth(space)
			// A word too long for any line starts where it is, when
			// there is room for a useful piece; one that fits a line of
			// its own goes to the next.
			if textWidth(word) > rest && room >= minPiece || line == "" {
				head, tail := breakWord(word, max(room, 1))
				lines = append(lines, line+space+head)
				word = tail
			} else {
				lines = append(lines, line)
			}
			line, space = "", ""
		}
		line += space + word
	}
	if line != "" || len(lines) == 0 {
		lines = append(lines, line)
	}
	return lines
}

// minPiece is the least room worth starting a long word in.
const minPiece = 8

// token is a word and the spaces before it. An arrow ("<-", "->") is one
// token with the word after it, so no line ends in an arrow whose source or
// upstream starts the next.
type token struct{ space, word string }

func tokens(s string) []token {
	var out []token
	for s != "" {
		rest := strings.TrimLeft(s, " ")
		space := s[:len(s)-len(rest)]
		if rest == "" {
			break
		}
		end := strings.IndexByte(rest, ' ')
		if end < 0 {
			end = len(rest)
		}
		word, after := rest[:end], rest[end:]
		if n := len(out); n > 0 && (out[n-1].word == "<-" || out[n-1].word == "->") {
			out[n-1].word += space + word
		} else {
			out = append(out, token{space, word})
		}
		s = after
	}
	return out
}

// breakWord splits a word longer than width into a head that fits and the
// rest, preferring to end the head at a separator.
func breakWord(word string, width int) (string, string) {
	r := []rune(word)
	if len(r) <= width {
		return word, ""
	}
	cut := width
	for i := width - 1; i >= width/2; i-- {
		if strings.ContainsRune("/,=:-", r[i]) {
			cut = i + 1
			break
		}
	}
	return string(r[:cut]), string(r[cut:])
}

// hang wraps s to width keeping its leading spaces, with every line after
// the first indented by indent spaces (a hanging indent).
func hang(s string, width, indent int) []string {
	if textWidth(s) <= width {
		return []string{s}
	}
	body := strings.TrimLeft(s, " ")
	lead := s[:len(s)-len(body)]
	lines := wrapHanging(body, width-len(lead), width-indent)
	lines[0] = lead + lines[0]
	for i := 1; i < len(lines); i++ {
		lines[i] = strings.Repeat(" ", indent) + lines[i]
	}
	return lines
}

// table lays out rows of strings in columns two spaces apart, fitting width:
// when the natural widths do not fit, the narrowable columns give up width
// and their cells wrap onto more lines. A row may carry a note, printed
// wrapped beneath it from the column noteFrom on. The last column is never
// padded, so no line ends in spaces.
type table struct {
	cols     []column
	rows     [][]string
	notes    []string // per row, may be empty
	headNote string   // the note under the header: what the notes are
	noteFrom int
	// noteIndent indents the notes further (a table whose notes start at
	// its first column still sets them off).
	noteIndent int
}

type column struct {
	header string
	narrow bool // may be narrowed: its cells wrap
	// floor is the width a narrowed column keeps while another column can
	// still give (a subject reads worse wrapped than a detail does).
	floor int
}

const columnGap = 2

// minColumn is the narrowest a narrowed column gets.
const minColumn = 12

func (t *table) add(cells []string, note string) {
	t.rows = append(t.rows, cells)
	t.notes = append(t.notes, note)
}

func (t *table) header() []string {
	h := make([]string, len(t.cols))
	for i, c := range t.cols {
		h[i] = c.header
	}
	return h
}

// widths are the columns' widths for a total width.
func (t *table) widths(width int) []int {
	ws := make([]int, len(t.cols))
	for _, row := range append([][]string{t.header()}, t.rows...) {
		for i, c := range row {
			ws[i] = max(ws[i], textWidth(c))
		}
	}
	total := columnGap * (len(ws) - 1)
	for _, w := range ws {
		total += w
	}
	// Take one rune at a time from the narrowable column that costs the
	// fewest extra lines (the widest of equals), first down to the floors,
	// then down to minColumn.
	for _, floors := range []bool{true, false} {
		for ; total > width; total-- {
			best, bestLines := -1, 0
			for i, w := range ws {
				lowest := minColumn
				if floors {
					lowest = max(lowest, t.cols[i].floor)
				}
				if !t.cols[i].narrow || w <= lowest {
					continue
				}
				ws[i]--
				lines := t.lines(ws)
				ws[i]++
				if best < 0 || lines < bestLines || lines == bestLines && w > ws[best] {
					best, bestLines = i, lines
				}
			}
			if best < 0 {
				break
			}
			ws[best]--
		}
	}
	return ws
}

// lines is how many lines the rows take at column widths ws.
func (t *table) lines(ws []int) int {
	n := 0
	for _, row := range t.rows {
		h := 1
		for i, c := range row {
			if t.cols[i].narrow && textWidth(c) > ws[i] {
				h = max(h, len(wrap(c, ws[i])))
			}
		}
		n += h
	}
	return n
}

func (t *table) render(w io.Writer, width int) error {
	ws := t.widths(width)
	indent := t.noteIndent
	for _, cw := range ws[:t.noteFrom] {
		indent += cw + columnGap
	}
	var b strings.Builder
	emit := func(cells []string, note string) {
		cols := make([][]string, len(cells))
		height := 1
		for i, c := range cells {
			if t.cols[i].narrow {
				cols[i] = wrap(c, ws[i])
			} else {
				cols[i] = []string{c}
			}
			height = max(height, len(cols[i]))
		}
		for l := range height {
			var line strings.Builder
			for i := range cells {
				cell := ""
				if l < len(cols[i]) {
					cell = cols[i][l]
				}
				line.WriteString(cell)
				if i < len(cells)-1 {
					line.WriteString(strings.Repeat(" ", ws[i]-textWidth(cell)+columnGap))
				}
			}
			b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
		}
		if note != "" {
			for _, l := range wrap(note, width-indent) {
				b.WriteString(strings.Repeat(" ", indent) + l + "\n")
			}
		}
	}
	emit(t.header(), t.headNote)
	for i, row := range t.rows {
		emit(row, t.notes[i])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

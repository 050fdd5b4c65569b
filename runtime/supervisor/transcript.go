package supervisor

import (
	"bytes"
	"fmt"
)

// Transcript is what a client keeps of a sandbox's output across
// attachments: the cursor to reattach from and the stdout and stderr bytes. Add
// refuses a record that is not the next one, so a gap or a duplicate in
// the bridge's replay is an error rather than a corrupt transcript.
type Transcript struct {
	Cursor uint64
	Stdout bytes.Buffer
	Stderr bytes.Buffer
}

// Add takes an event; events other than output are ignored.
func (tr *Transcript) Add(e Event) error {
	if e.Event != "output" {
		return nil
	}
	if e.Seq != tr.Cursor+1 {
		return fmt.Errorf("record %d after %d: gap or duplicate", e.Seq, tr.Cursor)
	}
	tr.Cursor = e.Seq
	switch e.Stream {
	case "stdout":
		tr.Stdout.Write(e.Data)
	case "stderr":
		tr.Stderr.Write(e.Data)
	}
	return nil
}

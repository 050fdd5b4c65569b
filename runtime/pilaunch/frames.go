package pilaunch

import (
	"bytes"
	"encoding/json"
	"sync"
)

// Response frames are forwarded only to the spawn that asked.
//
// Pi RPC answers a command with a `{"type":"response","id":...}` line on
// stdout, and Paseo routes it by id to the request it is waiting for.
// Paseo numbers its requests req_1, req_2, ... in each daemon process. The
// sandbox outlives a killed daemon, so the output a respawn replays (and
// what Pi writes afterwards) can hold the answer to a command the killed
// daemon sent: the same id as one of the new daemon's. The bridge
// therefore forwards a response frame only for an id that this spawn wrote
// to Pi's stdin and has not yet seen answered, and only when the frame
// began after that command was written. Every other line passes byte for
// byte. Both sides are untrusted data: Pi's stdout can be written by any
// process in the sandbox, and Paseo's stdin is parsed only for its ids,
// within MaxFrameLine.

// MaxFrameLine bounds a line the bridge assembles to read it (the
// TypeScript client's bound). A longer stdin line is passed on without its
// id being registered (its answer is then dropped); a longer stdout line
// is dropped whole.
const MaxFrameLine = 32 << 20

const (
	maxIDBytes = 1024 // a longer id is not registered
	maxPending = 4096 // outstanding ids at once; beyond, not registered
)

// pending is the ids this spawn wrote and has not seen answered, each with
// the output position its command was written after: records up to it
// were produced before Pi could have read the command.
type pending struct {
	mu  sync.Mutex
	ids map[string][]uint64
	n   int
}

func (p *pending) add(id string, after uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids == nil {
		p.ids = map[string][]uint64{}
	}
	if len(id) > maxIDBytes || p.n >= maxPending {
		return false
	}
	p.ids[id] = append(p.ids[id], after)
	p.n++
	return true
}

// take answers whether a response frame for id that began in output
// record seq answers a command of this spawn, and if so marks it answered.
func (p *pending) take(id string, seq uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, after := range p.ids[id] {
		if seq > after {
			l := append(p.ids[id][:i:i], p.ids[id][i+1:]...)
			if len(l) == 0 {
				delete(p.ids, id)
			} else {
				p.ids[id] = l
			}
			p.n--
			return true
		}
	}
	return false
}

// frameHead reads a line as Paseo's JSON.parse would for routing: an
// object's exact "type" and "id" keys (the last of duplicates, as in
// JavaScript; no case folding). ok is false for a line that is not a JSON
// object.
func frameHead(line []byte) (typ string, id string, idIsString bool, ok bool) {
	t := bytes.TrimSpace(line)
	if len(t) == 0 || t[0] != '{' {
		return "", "", false, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(t, &m) != nil {
		return "", "", false, false
	}
	_ = json.Unmarshal(m["type"], &typ)
	if raw, has := m["id"]; has && json.Unmarshal(raw, &id) == nil && len(raw) > 0 && raw[0] == '"' {
		idIsString = true
	}
	return typ, id, idIsString, true
}

// inLines assembles Paseo's stdin into lines to register their ids; the
// bytes themselves go to Pi unchanged, whatever this finds.
type inLines struct {
	line []byte
	over bool // the current line passed MaxFrameLine: skip to its end
}

// feed returns the string ids of the command lines completed in chunk.
func (a *inLines) feed(chunk []byte) []string {
	var ids []string
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		seg := chunk
		if i >= 0 {
			seg, chunk = chunk[:i], chunk[i+1:]
		} else {
			chunk = nil
		}
		if !a.over && len(a.line)+len(seg) > MaxFrameLine {
			a.over, a.line = true, nil
		}
		if !a.over {
			a.line = append(a.line, seg...)
		}
		if i < 0 {
			break
		}
		if !a.over {
			if _, id, isStr, ok := frameHead(a.line); ok && isStr {
				ids = append(ids, id)
			}
		}
		a.line, a.over = a.line[:0], false
	}
	return ids
}

// outLines assembles Pi's stdout into lines and decides each: forwarded
// byte for byte, or dropped (a response frame nobody of this spawn waits
// for, a line Paseo could not route safely).
type outLines struct {
	pend    *pending
	line    []byte
	lineSeq uint64 // the record holding the line's first byte
	over    bool   // dropping a line longer than MaxFrameLine up to its end
	dropped int
	// turnEnds counts agent_end frames forwarded since the caller last
	// reset it (the turn-end import, gitturn.go).
	turnEnds int
}

// feed takes output record seq and returns the bytes to write to Paseo:
// every line it completes that is forwarded. A line's tail without its
// newline stays until its end arrives. drops counts the lines dropped.
func (o *outLines) feed(seq uint64, data []byte) (out []byte, drops int) {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		seg := data
		if i >= 0 {
			seg, data = data[:i+1], data[i+1:]
		} else {
			data = nil
		}
		if !o.over && len(o.line) == 0 {
			o.lineSeq = seq
		}
		if !o.over && len(o.line)+len(seg) > MaxFrameLine {
			o.over, o.line = true, nil
			drops++
		}
		if !o.over {
			o.line = append(o.line, seg...)
		}
		if i < 0 {
			break
		}
		if !o.over {
			if o.forward(o.line, o.lineSeq) {
				out = append(out, o.line...)
			} else {
				drops++
			}
		}
		o.line, o.over = o.line[:0], false
	}
	o.dropped += drops
	return out, drops
}

// boundary reports whether everything fed so far is decided: no line is
// held or being dropped. Only there may the cursor advance, so that a
// respawn's replay begins at a line's start.
func (o *outLines) boundary() bool { return len(o.line) == 0 && !o.over }

// reset forgets a partial line: the stream is replayed from the cursor,
// which is at a line's start.
func (o *outLines) reset() { o.line, o.over = o.line[:0], false }

// flush decides a last line without its newline (the stream ended).
func (o *outLines) flush() (out []byte, drops int) {
	if o.over || len(o.line) == 0 {
		o.reset()
		return nil, 0
	}
	if o.forward(o.line, o.lineSeq) {
		out = append(out, o.line...)
	} else {
		drops = 1
		o.dropped++
	}
	o.reset()
	return out, drops
}

func (o *outLines) forward(line []byte, seq uint64) bool {
	t := bytes.TrimSpace(line)
	if len(t) == 0 || t[0] != '{' {
		return true // not an object: no frame Paseo routes
	}
	typ, id, isStr, ok := frameHead(t)
	if !ok {
		return false // an object Paseo might parse differently: not passed
	}
	if typ == "agent_end" {
		o.turnEnds++
	}
	if typ != "response" {
		return true
	}
	return isStr && o.pend.take(id, seq)
}

package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// sessionVersion is Pi's CURRENT_SESSION_VERSION.
const sessionVersion = 3

// sessionHeader is the first line of a session file.
type sessionHeader struct {
	Type          string `json:"type"`
	Version       int    `json:"version,omitempty"`
	ID            string `json:"id"`
	Timestamp     string `json:"timestamp"`
	Cwd           string `json:"cwd"`
	ParentSession string `json:"parentSession,omitempty"`
}

// Entry bodies, field order as Pi writes them.
type messageEntry struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	ParentID  *string         `json:"parentId"`
	Timestamp string          `json:"timestamp"`
	Message   json.RawMessage `json:"message"`
}

type modelChangeEntry struct {
	Type      string  `json:"type"`
	ID        string  `json:"id"`
	ParentID  *string `json:"parentId"`
	Timestamp string  `json:"timestamp"`
	Provider  string  `json:"provider"`
	ModelID   string  `json:"modelId"`
}

type thinkingChangeEntry struct {
	Type          string  `json:"type"`
	ID            string  `json:"id"`
	ParentID      *string `json:"parentId"`
	Timestamp     string  `json:"timestamp"`
	ThinkingLevel string  `json:"thinkingLevel"`
}

type sessionInfoEntry struct {
	Type      string  `json:"type"`
	ID        string  `json:"id"`
	ParentID  *string `json:"parentId"`
	Timestamp string  `json:"timestamp"`
	Name      string  `json:"name"`
}

// fileLine is one line of the session file, kept with what Pi's deferred
// write needs to know about it.
type fileLine struct {
	raw       []byte
	assistant bool
}

// session mimics Pi's SessionManager for one JSONL file: entries form a
// parent chain, and nothing is written until the first assistant message
// exists; then everything pending is appended at once.
type session struct {
	persist bool
	dir     string
	file    string
	cwd     string
	id      string
	lines   []fileLine
	written int // lines already in the file
	leaf    *string
	ids     map[string]bool
	// messages are the agent messages, for get_messages and the counts.
	messages []json.RawMessage
	name     string
}

func isoNow() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000Z") }

// uuidv7 makes a version 7 UUID like Pi's session ids.
func uuidv7() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(time.Now().UnixMilli()))
	copy(b[0:6], ms[2:8])
	b[6] = 0x70 | (b[6] & 0x0f)
	b[8] = 0x80 | (b[8] & 0x3f)
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// entryID is Pi's short entry id: 8 hex characters, collision-checked.
func (s *session) entryID() string {
	for {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic(err)
		}
		id := hex.EncodeToString(b[:])
		if !s.ids[id] {
			s.ids[id] = true
			return id
		}
	}
}

// defaultSessionDir is <agentDir>/sessions/--<cwd without its leading
// slash, / \ and : turned into ->--, Pi's getDefaultSessionDir.
func defaultSessionDir(agentDir, cwd string) string {
	safe := strings.TrimPrefix(cwd, "/")
	safe = strings.TrimPrefix(safe, `\`)
	safe = strings.NewReplacer("/", "-", `\`, "-", ":", "-").Replace(safe)
	return filepath.Join(agentDir, "sessions", "--"+safe+"--")
}

// sessionFileName is <ISO timestamp with : and . turned into ->_<id>.jsonl.
func sessionFileName(timestamp, id string) string {
	return strings.NewReplacer(":", "-", ".", "-").Replace(timestamp) + "_" + id + ".jsonl"
}

func inMemorySession(cwd string) *session {
	s := &session{cwd: cwd, ids: map[string]bool{}}
	s.start()
	return s
}

// newSession starts a fresh persisted session in dir, as
// SessionManager.create does; dir is created now, the file later.
func newSession(dir, cwd string) (*session, error) {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	s := &session{persist: true, dir: dir, cwd: cwd, ids: map[string]bool{}}
	s.start()
	return s, nil
}

// start resets s to a new session with a header and no entries.
func (s *session) start() {
	s.id = uuidv7()
	ts := isoNow()
	h := mustJSON(sessionHeader{Type: "session", Version: sessionVersion, ID: s.id, Timestamp: ts, Cwd: s.cwd})
	s.lines = []fileLine{{raw: h}}
	s.written = 0
	s.leaf = nil
	s.messages = nil
	s.name = ""
	if s.persist {
		s.file = filepath.Join(s.dir, sessionFileName(ts, s.id))
	}
}

// errMissingCwd is Pi's MissingSessionCwdError: resuming a session whose
// header cwd is gone is fatal outside interactive mode.
type errMissingCwd struct{ cwd, file, fallback string }

func (e *errMissingCwd) Error() string {
	return fmt.Sprintf("Stored session working directory does not exist: %s\nSession file: %s\nCurrent working directory: %s", e.cwd, e.file, e.fallback)
}

// openSession resumes path as SessionManager.open does: an existing file
// with a valid header is continued (its cwd becomes the session's), an
// empty or headerless one is restarted in place, a missing one becomes a
// new session that will be written at that path. dir is the directory for
// new sessions (the file's parent when empty).
func openSession(path, dir, fallbackCwd string) (*session, error) {
	if dir == "" {
		dir = filepath.Dir(path)
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	s := &session{persist: true, dir: dir, cwd: fallbackCwd, ids: map[string]bool{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		s.start()
		s.file = path
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	var lines []fileLine
	var header *sessionHeader
	for _, raw := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(raw)) == 0 || !json.Valid(raw) {
			continue // Pi skips malformed lines
		}
		if header == nil && len(lines) == 0 {
			var h sessionHeader
			if json.Unmarshal(raw, &h) != nil || h.Type != "session" || h.ID == "" {
				break // no valid header: Pi treats the file as empty
			}
			header = &h
		}
		lines = append(lines, fileLine{raw: append([]byte(nil), raw...)})
	}
	if header == nil {
		// Pi truncates a headerless file and writes a fresh header at once.
		s.start()
		s.file = path
		if err := os.WriteFile(path, append(append([]byte(nil), s.lines[0].raw...), '\n'), 0o666); err != nil {
			return nil, err
		}
		s.written = 1
		return s, nil
	}
	s.id = header.ID
	s.file = path
	if header.Cwd != "" {
		s.cwd = header.Cwd
		if _, err := os.Stat(header.Cwd); err != nil {
			return nil, &errMissingCwd{cwd: header.Cwd, file: path, fallback: fallbackCwd}
		}
	}
	s.lines = []fileLine{lines[0]}
	for _, l := range lines[1:] {
		var e struct {
			Type    string          `json:"type"`
			ID      string          `json:"id"`
			Message json.RawMessage `json:"message"`
			Name    *string         `json:"name"`
		}
		if json.Unmarshal(l.raw, &e) != nil {
			s.lines = append(s.lines, l)
			continue
		}
		if e.ID != "" {
			s.ids[e.ID] = true
			id := e.ID
			s.leaf = &id
		}
		switch e.Type {
		case "message":
			var m struct{ Role string }
			_ = json.Unmarshal(e.Message, &m)
			l.assistant = m.Role == "assistant"
			s.messages = append(s.messages, e.Message)
		case "session_info":
			if e.Name != nil {
				s.name = strings.TrimSpace(*e.Name)
			}
		}
		s.lines = append(s.lines, l)
	}
	s.written = len(s.lines)
	return s, nil
}

// findSession resolves a --session argument that is not a path: a session
// id or id prefix among dir's session files, as Pi does for the current
// project.
func findSession(dir, arg string) (string, bool) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", false
	}
	var prefix string
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".jsonl") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		line, _ := bufio.NewReader(f).ReadBytes('\n')
		f.Close()
		var h sessionHeader
		if json.Unmarshal(bytes.TrimSpace(line), &h) != nil || h.Type != "session" {
			continue
		}
		if h.ID == arg {
			return p, true
		}
		if prefix == "" && strings.HasPrefix(h.ID, arg) {
			prefix = p
		}
	}
	return prefix, prefix != ""
}

// appendEntry adds an entry (built by mk with its id and parent) as the new
// leaf and persists it under Pi's rule.
func (s *session) appendEntry(mk func(id string, parent *string, ts string) any, assistant bool) error {
	id := s.entryID()
	raw, err := marshal(mk(id, s.leaf, isoNow()))
	if err != nil {
		return err
	}
	s.lines = append(s.lines, fileLine{raw: raw, assistant: assistant})
	s.leaf = &id
	return s.flush()
}

func (s *session) appendMessage(msg json.RawMessage, assistant bool) error {
	s.messages = append(s.messages, msg)
	return s.appendEntry(func(id string, parent *string, ts string) any {
		return messageEntry{Type: "message", ID: id, ParentID: parent, Timestamp: ts, Message: msg}
	}, assistant)
}

func (s *session) appendModelChange(provider, modelID string) error {
	return s.appendEntry(func(id string, parent *string, ts string) any {
		return modelChangeEntry{Type: "model_change", ID: id, ParentID: parent, Timestamp: ts, Provider: provider, ModelID: modelID}
	}, false)
}

func (s *session) appendThinkingChange(level string) error {
	return s.appendEntry(func(id string, parent *string, ts string) any {
		return thinkingChangeEntry{Type: "thinking_level_change", ID: id, ParentID: parent, Timestamp: ts, ThinkingLevel: level}
	}, false)
}

func (s *session) appendSessionInfo(name string) error {
	s.name = name
	return s.appendEntry(func(id string, parent *string, ts string) any {
		return sessionInfoEntry{Type: "session_info", ID: id, ParentID: parent, Timestamp: ts, Name: name}
	}, false)
}

// flush writes pending lines once an assistant message exists, appending.
func (s *session) flush() error {
	if !s.persist || s.file == "" || s.written == len(s.lines) {
		return nil
	}
	hasAssistant := false
	for _, l := range s.lines {
		if l.assistant {
			hasAssistant = true
			break
		}
	}
	if !hasAssistant {
		return nil
	}
	var buf bytes.Buffer
	for _, l := range s.lines[s.written:] {
		buf.Write(l.raw)
		buf.WriteByte('\n')
	}
	f, err := os.OpenFile(s.file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
	if err != nil {
		return err
	}
	_, err = f.Write(buf.Bytes())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	s.written = len(s.lines)
	return nil
}

// sessionFile is what get_state reports: the file path (even before it is
// written), or "" for --no-session.
func (s *session) sessionFile() string {
	if !s.persist {
		return ""
	}
	return s.file
}

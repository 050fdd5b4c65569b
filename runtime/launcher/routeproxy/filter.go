package routeproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Filtering tools/list answers to the scope. Streamable HTTP lets the
// daemon answer a POST with one JSON body or with a text/event-stream of
// JSON-RPC messages (Paseo's stateless route, built on the MCP SDK, may
// use either), so both are filtered: the JSON body whole (bounded), the
// stream event by event as it comes. Any other answer to a request that
// asked for tools/list is refused, not passed through unfiltered.

// MaxAnswer bounds one JSON answer or one event of a stream the proxy
// filters; a tools/list of Paseo's catalog is a few KiB.
const MaxAnswer = 4 << 20

var errAnswer = errors.New("an answer to tools/list the proxy cannot filter")

// filterAnswer rewrites resp so that every tools list in it lists only
// tools of the scope.
func (s Scope) filterAnswer(resp *http.Response, dropped *atomic.Int64) error {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode == http.StatusAccepted || resp.StatusCode >= 300:
		return nil // no result in it: errors and acknowledgments pass
	case mt == "application/json":
		data, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer+1))
		resp.Body.Close()
		if err != nil || len(data) > MaxAnswer {
			return errAnswer
		}
		out, err := s.filterMessages(data, dropped)
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(out))
		resp.ContentLength = int64(len(out))
		resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
		return nil
	case mt == "text/event-stream":
		pr, pw := io.Pipe()
		up := resp.Body
		go func() {
			err := s.filterStream(up, pw, dropped)
			up.Close()
			pw.CloseWithError(err)
		}()
		resp.Body = pr
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	return errAnswer
}

// filterMessages filters one JSON-RPC message or a batch of them. The
// answer is read with the same strict decoding as requests and written
// back canonical, so the agent's MCP client reads exactly the tools list
// that was filtered (a tool named by a case-variant or repeated key would
// otherwise read differently here and there).
func (s Scope) filterMessages(data []byte, dropped *atomic.Int64) ([]byte, error) {
	root, err := decodeStrict(data)
	if err != nil {
		return nil, errAnswer
	}
	msgs := []*node{root}
	if root.kind == kindArray {
		msgs = root.elems
	}
	for _, m := range msgs {
		if err := s.filterOne(m, dropped); err != nil {
			return nil, err
		}
	}
	return root.bytes(), nil
}

// filterOne drops, in place, from a result listing tools the tools
// outside the scope. Every result with a tools list is filtered, whatever
// its id: the daemon echoes an id re-serialized (1.0 as 1, "\u0061" as
// "a"), so matching answers to requests by id would let a client pick an
// id the filter does not recognize. Only answers to a body that asked for
// tools/list are filtered at all (Proxy.New).
func (s Scope) filterOne(m *node, dropped *atomic.Int64) error {
	if m.kind != kindObject {
		return errAnswer
	}
	res, ok := m.get("result")
	switch {
	case !ok || res.kind == kindNull:
		return nil // an error answer, a notification or a request
	case res.kind != kindObject:
		return errAnswer
	}
	tools, ok := res.get("tools")
	if !ok {
		return nil // lists nothing: nothing to narrow
	}
	if tools.kind != kindArray {
		return errAnswer
	}
	kept := []*node{}
	for _, tool := range tools.elems {
		if name, ok := tool.get("name"); ok && name.kind == kindString && slices.Contains(s.Tools, name.str) {
			kept = append(kept, tool)
		}
	}
	dropped.Add(int64(len(tools.elems) - len(kept)))
	tools.elems = kept
	// A cursor would lead the client to the daemon's next page, unfiltered
	// the same way; the scope is small, so one page is the whole answer.
	res.members = slices.DeleteFunc(res.members, func(mb member) bool { return mb.key == "nextCursor" })
	return nil
}

// filterStream copies an event stream, rewriting the data of each event
// that carries a tools/list answer. Events are separated by a blank line;
// an event's data lines are joined with newlines (the SSE rules) and
// written back as one data line.
func (s Scope) filterStream(in io.Reader, out io.Writer, dropped *atomic.Int64) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), MaxAnswer)
	var other []string
	var data []string
	hasData := false
	flush := func() error {
		var b strings.Builder
		for _, l := range other {
			b.WriteString(l + "\n")
		}
		if hasData {
			joined := strings.Join(data, "\n")
			if strings.TrimSpace(joined) != "" {
				f, err := s.filterMessages([]byte(joined), dropped)
				if err != nil {
					return err
				}
				joined = string(f) // compact: one data line
			}
			b.WriteString("data: " + joined + "\n")
		}
		b.WriteString("\n")
		other, data, hasData = nil, nil, false
		_, err := io.WriteString(out, b.String())
		return err
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if err := flush(); err != nil {
				return err
			}
		case line == "data" || strings.HasPrefix(line, "data:"):
			v := strings.TrimPrefix(strings.TrimPrefix(line, "data"), ":")
			data = append(data, strings.TrimPrefix(v, " "))
			hasData = true
		default:
			other = append(other, line) // event:, id:, retry:, comments
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if hasData || len(other) > 0 {
		return flush()
	}
	return nil
}

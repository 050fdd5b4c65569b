package supervisor

import (
	"testing"

	"paseo.dev/paseo-policy/policy/schema"
)

// Facts arrive inside one createSandbox frame, so the frame limit must stay
// within the bound every other input is read under (schema.MaxInputBytes,
// which the loader also applies to in-memory input).
func TestFactsFrameWithinInputBound(t *testing.T) {
	if MaxFrame > schema.MaxInputBytes {
		t.Fatalf("MaxFrame %d exceeds schema.MaxInputBytes %d: facts in a request could outgrow the input bound", MaxFrame, schema.MaxInputBytes)
	}
}

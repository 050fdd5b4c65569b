package ocicheck

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/xeipuuv/gojsonschema"
)

// Schema validates config against config-schema.json in schemaDir (the
// schema/ directory of the runtime-spec module; its $refs are relative).
func Schema(schemaDir string, config []byte) error {
	abs, err := filepath.Abs(filepath.Join(schemaDir, "config-schema.json"))
	if err != nil {
		return err
	}
	res, err := gojsonschema.Validate(gojsonschema.NewReferenceLoader("file://"+abs), gojsonschema.NewBytesLoader(config))
	if err != nil {
		return fmt.Errorf("json schema: %w", err)
	}
	if res.Valid() {
		return nil
	}
	var msgs []string
	for _, e := range res.Errors() {
		msgs = append(msgs, e.String())
	}
	return fmt.Errorf("%s", strings.Join(msgs, "\n"))
}

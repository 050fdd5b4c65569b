package compiler

import (
	_ "embed"
	"encoding/json"
	"sync"
)

// piCatalogueJSON is Pi's built-in model catalogue: for each provider and
// model id the image's Pi ships, the provider API Pi speaks to it. It is
// generated from the image's @earendil-works/pi-ai by image/pi/catalogue.mjs
// and checked against the image's Pi by the contract suite
// (test/picontract), so the compiler needs no image to compile and gives
// the same bytes for the same facts (docs/image.md, "Pi's model
// catalogue").
//
//go:embed pi-catalogue.json
var piCatalogueJSON []byte

// PiCatalogue is the embedded catalogue's content.
type PiCatalogue struct {
	Pi     string                       `json:"pi"`     // the Pi version it was read from
	Models map[string]map[string]string `json:"models"` // provider -> model id -> API
}

// EmbeddedPiCatalogue is the catalogue the compiler uses, and its bytes as
// embedded (for the contract suite's byte comparison).
var EmbeddedPiCatalogue = sync.OnceValues(func() (PiCatalogue, []byte) {
	var cat PiCatalogue
	if err := json.Unmarshal(piCatalogueJSON, &cat); err != nil || cat.Pi == "" || len(cat.Models) == 0 {
		// A build-time input of this package: a broken one is a broken build.
		panic("policy/compiler/pi-catalogue.json is not Pi's catalogue; regenerate it with image/pi/catalogue.mjs")
	}
	return cat, piCatalogueJSON
})

// catalogueAPI is the API Pi speaks to its built-in model id of provider,
// and whether the catalogue has that model.
func catalogueAPI(provider, id string) (string, bool) {
	cat, _ := EmbeddedPiCatalogue()
	api, ok := cat.Models[provider][id]
	return api, ok
}

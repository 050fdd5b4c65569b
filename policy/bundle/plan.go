package bundle

import "paseo.dev/paseo-policy/policy/grant"

// Plan is what the renderers read, and all they read: the grants, and the
// decisions about a launch that are not authority (the manifest's header,
// the DNS mode egress.json records, the identity each bind source resolved
// to). The compiler builds it; policy/render/oci renders it into a bundle,
// and the other renderings read that bundle.
type Plan struct {
	grant.Plan
	Header Manifest // manifest.json without its grants and outputs
	DNS    string   // registry.network.dns
	Pins   []Pin    // one per bind with a host source, by destination
	// Models is files/models.json when the model route is granted: the
	// daemon's entry for the selected provider, pointed at the route.
	Models []byte
}

// Package profiles embeds the reviewed launch profiles. A profile is policy:
// changing one changes what every sandbox of that kind may do, so each edit
// shows up in golden files and in `paseo-policy diff`.
package profiles

import "embed"

// FS holds one <name>.cue file per profile.
//
//go:embed *.cue
var FS embed.FS

package compiler

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/grant"
)

// The daemon's settings.json is an allowlist (docs/grants.md "What
// settings.json may say"): each key Pi 1.6.0 reads is listed with what Pi
// does with its value, and any other key is refused, since Pi or an
// extension may act on it in ways nobody has reviewed. Values are never
// printed: apiKeys holds secrets, and a path or command line may as well.

// settingsBytes bounds the settings.json the compiler reads.
const settingsBytes = 64 << 10

const settingsFact = "state.agentDir/settings.json"

// settingKind is what Pi does with one key's value.
type settingKind int

const (
	// inert: read as data (a name, number, flag, mode, or an object of
	// them); nothing in it reaches spawn, exec, import or a path Pi loads.
	// Objects are accepted whole: Pi reads their fields by name as numbers,
	// flags and strings, and nothing nested is run or loaded.
	inert settingKind = iota
	// resources: a list of paths Pi loads as code (extensions) or as the
	// model's instructions and data (skills, prompts, themes); path-checked.
	resources
	// packages: sources Pi loads extensions and resources from; path-checked,
	// their object form allowlisted too.
	packages
	// shell: the program Pi runs every bash command with; must lie in the
	// read-only image.
	shell
	// trust: whether the workspace's .pi settings and extensions load.
	trust
	// refused: a command Pi runs or a place it reads and writes state, in a
	// form no check here can bound.
	refused
)

type setting struct {
	kind settingKind
	why  string // refused: what Pi does with the value, for the message
}

// settingKeys are the keys Pi 1.6.0 reads from its global settings.json:
// its SettingsSchema (core/settings-schema.js; the Pi contract suite checks
// the two agree), the legacy keys it migrates (queueMode, websockets;
// skills as an object is refused below) and apiKeys (migrations.js).
var settingKeys = map[string]setting{
	"autocompleteMaxVisible":     {kind: inert},
	"branchSummary":              {kind: inert},
	"collapseChangelog":          {kind: inert},
	"compaction":                 {kind: inert},
	"defaultModel":               {kind: inert},
	"defaultProvider":            {kind: inert},
	"defaultThinkingLevel":       {kind: inert},
	"defaultTools":               {kind: inert}, // names of built-in tools; all run inside the sandbox anyway
	"doubleEscapeAction":         {kind: inert},
	"editorPaddingX":             {kind: inert},
	"enableAnalytics":            {kind: inert}, // network only, and PI_OFFLINE=1
	"enableInstallTelemetry":     {kind: inert}, // likewise
	"enableSkillCommands":        {kind: inert},
	"enabledModels":              {kind: inert},
	"followUpMode":               {kind: inert},
	"fullscreenExitOutput":       {kind: inert},
	"fullscreenScrollbar":        {kind: inert},
	"hideThinkingBlock":          {kind: inert},
	"httpIdleTimeoutMs":          {kind: inert},
	"images":                     {kind: inert},
	"lastChangelogVersion":       {kind: inert},
	"markdown":                   {kind: inert},
	"outputPad":                  {kind: inert},
	"queueMode":                  {kind: inert}, // legacy steeringMode
	"quietStartup":               {kind: inert},
	"retry":                      {kind: inert},
	"showCacheMissNotices":       {kind: inert},
	"showHardwareCursor":         {kind: inert},
	"steeringMode":               {kind: inert},
	"terminal":                   {kind: inert},
	"thinkingBudgets":            {kind: inert},
	"trackingId":                 {kind: inert},
	"transport":                  {kind: inert},
	"treeFilterMode":             {kind: inert},
	"tuiMode":                    {kind: inert},
	"warnings":                   {kind: inert},
	"websocketConnectTimeoutMs":  {kind: inert},
	"websockets":                 {kind: inert}, // legacy transport
	"$schema":                    {kind: inert}, // the JSON schema's name, for editors
	"cacheWarming":               {kind: inert}, // extra model requests, through the route like any
	"codemode":                   {kind: inert}, // how tools are presented to the model; scripts run inside the sandbox anyway
	"deviceId":                   {kind: inert},
	"extensionChangelogVersions": {kind: inert},
	"fullscreenCopyOnSelect":     {kind: inert},
	"fullscreenWheelScrollLines": {kind: inert},
	"modelThinkingLevels":        {kind: inert},
	"sessionShareDestination":    {kind: inert}, // /share uploads: network only, and egress allows no such host
	// A theme is a JSON colour map found by name among the loaded themes or
	// in <agentDir>/themes (Pi refuses a name with "/"): data, never code.
	"theme": {kind: inert},
	// HTTP_PROXY and HTTPS_PROXY for Pi and its children (unless set): where
	// traffic may go is still only what the egress rules allow.
	"httpProxy": {kind: inert},

	"defaultProjectTrust": {kind: trust},
	"extensions":          {kind: resources},
	"skills":              {kind: resources},
	"prompts":             {kind: resources},
	"themes":              {kind: resources},
	"packages":            {kind: packages},
	"shellPath":           {kind: shell},

	"shellCommandPrefix": {kind: refused, why: "shell text Pi runs before every bash command; it can run any file, one in a read-write bind too, and shell text cannot be path-checked"},
	"npmCommand":         {kind: refused, why: "the argv Pi spawns for npm (at start for an npm: package it has not installed, and for every install); a wrapper's argv can run anything, and without it Pi runs the image's npm"},
	"selfUpdateCommand":  {kind: refused, why: "the argv `pi update` runs to update Pi itself; a command line cannot be path-checked, and the image's Pi is pinned and read-only"},
	"externalEditor":     {kind: refused, why: "a command line Pi runs for the external-editor key; it cannot be path-checked, and a sandbox has no editor to open"},
	"sessionDir":         {kind: refused, why: "the directory Pi writes session logs to and resumes them from when the launch names none; where a sandbox keeps session logs is state.sessionDir's to say, and a probe keeps none"},
	"apiKeys":            {kind: refused, why: "legacy API keys Pi moves into auth.json at start when there is none, where a value starting with \"!\" runs as a shell command; credentials come from the facts, never settings.json"},
}

// packageKeys are the keys of a package entry in object form
// (PackageSource). Only source names something Pi loads; autoload is a flag
// and the resource lists are patterns that select among the package's own
// files (package-manager.js applyPackageFilter), never add a path.
var packageKeys = []string{"autoload", "extensions", "prompts", "skills", "source", "themes"}

// checkSettings refuses a projected settings.json that says anything off
// the allowlist, or names a command or code a sandbox could have written:
// project resources of a workspace other agents share (defaultProjectTrust
// "always"), a path in a bind from the host, a shell outside the image.
// settings is the projected one (state.go agentDirProjection), nil when
// the agent dir holds none.
func (c *compilation) checkSettings(p *grant.Plan, settings *source) {
	if settings == nil {
		return
	}
	data, err := c.res.ReadSmall(rootOf(c.dep.Roots.State, settings.host), settings.host, settingsBytes)
	var set map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(data, &set)
	}
	if err != nil || set == nil {
		c.diags.Addf(diag.StateSettings, settingsFact, "settings.json must be a JSON object of at most %d bytes", settingsBytes)
		return
	}
	sc := settingsCheck{diags: c.diags, agentDir: path.Dir(settings.dest)}
	for _, g := range p.Of(grant.KindMount) {
		sc.mounts = append(sc.mounts, g.(grant.Mount))
	}
	for _, key := range slices.Sorted(maps.Keys(set)) {
		s, ok := settingKeys[key]
		raw := set[key]
		switch {
		case !ok:
			sc.refuse("settings.json sets %q, which Pi 1.6.0 is not known to read as data; a key off the allowlist is refused", key)
		case s.kind == refused:
			sc.refuse("settings.json sets %s: %s", key, s.why)
		case s.kind == resources:
			sc.resources(key, raw)
		case s.kind == packages:
			sc.packages(raw)
		case s.kind == shell:
			sc.shellPath(raw)
		case s.kind == trust:
			sc.trust(raw)
		}
	}
}

type settingsCheck struct {
	diags    *diag.List
	agentDir string        // Pi's agent dir in the sandbox: where relative paths lie
	mounts   []grant.Mount // every mount of the launch, in plan order
}

func (sc settingsCheck) refuse(format string, args ...any) {
	sc.diags.Addf(diag.StateSettings, settingsFact, format, args...)
}

// trust refuses every defaultProjectTrust but "ask" and "never".
func (sc settingsCheck) trust(raw json.RawMessage) {
	var v string
	if json.Unmarshal(raw, &v) == nil && (v == "ask" || v == "never") {
		return
	}
	if v == "always" {
		sc.refuse("defaultProjectTrust \"always\" would load the workspace's .pi extensions, which other agents sharing it can write")
		return
	}
	sc.refuse("defaultProjectTrust must be \"ask\" or \"never\"")
}

// resources checks a list of paths Pi loads. Entries that are patterns
// (!, + or - first, or a * or ?) only select among the files the plain
// entries and Pi's own directories hold (package-manager.js
// resolveLocalEntries, applyPatterns), so only plain entries are checked.
func (sc settingsCheck) resources(key string, raw json.RawMessage) {
	var entries []string
	if json.Unmarshal(raw, &entries) != nil {
		sc.refuse("%s must be a list of strings", key)
		return
	}
	for i, e := range entries {
		if isPattern(e) {
			continue
		}
		sc.loadable(fmt.Sprintf("%s[%d]", key, i), strings.TrimFunc(e, jsSpace))
	}
}

// packages checks each package source: a string, or an object with a
// source and only the keys of packageKeys.
func (sc settingsCheck) packages(raw json.RawMessage) {
	var entries []any
	if json.Unmarshal(raw, &entries) != nil {
		sc.refuse("packages must be a list")
		return
	}
	for i, e := range entries {
		label := fmt.Sprintf("packages[%d]", i)
		var src string
		switch e := e.(type) {
		case string:
			src = e
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(e)) {
				if !slices.Contains(packageKeys, k) {
					sc.refuse("%s sets %q, which is not a key of a Pi 1.6.0 package entry; a key off the allowlist is refused", label, k)
				}
			}
			s, ok := e["source"].(string)
			if !ok {
				sc.refuse("%s must name its source as a string", label)
				continue
			}
			src = s
		default:
			sc.refuse("%s must be a source string or an object with one", label)
			continue
		}
		sc.source(label, src)
	}
}

// source checks one package source as Pi 1.6.0 reads it (package-manager.js
// parseSource). An npm: package loads from <agentDir>/npm/node_modules/<name>
// or the global root the image's npm names, both joined with the name, so
// the name must be a plain one. Every other source is a path, or a git or
// URL source that Pi clones into <agentDir>/git (refusing ".." itself) and
// otherwise treats as a path: checked as a path either way.
func (sc settingsCheck) source(label, src string) {
	if spec, ok := strings.CutPrefix(src, "npm:"); ok {
		spec = strings.TrimFunc(spec, jsSpace)
		name := spec
		if m := npmSpec.FindStringSubmatch(spec); m != nil {
			name = m[1]
		}
		if !npmName.MatchString(name) {
			sc.refuse("%s names an npm package by something other than a plain package name; Pi joins the name to its install roots, so a path in it would load from outside them", label)
		}
		return
	}
	sc.loadable(label, strings.TrimFunc(src, jsSpace))
}

// loadable refuses a path Pi would load that is, holds or lies in a bind
// from the host. Only the image and the sandbox's private tmpfs (the agent
// dir projection, HOME, /tmp) are left: a bind read-only here may be
// read-write in another agent's sandbox (a shared workspace or repository),
// and the compiler sees one launch. A private tmpfs holds only what this
// sandbox wrote since it started, and dies with it.
func (sc settingsCheck) loadable(label, v string) {
	p, ok := piPath(v, sc.agentDir)
	if !ok {
		sc.refuse("%s names a file: URL, which Pi decodes as a URL; name the path itself", label)
		return
	}
	for _, g := range sc.mounts {
		if g.IsBind() && (pathform.Beneath(g.Destination, p) || pathform.Beneath(p, g.Destination)) {
			sc.refuse("%s names a path that is, holds or lies in the bind at %s (%s); Pi loads it as code or instructions, so it must lie in the image or a private tmpfs", label, g.Destination, g.Fact)
			return
		}
	}
}

// shellPath refuses a shell outside the read-only image: Pi runs it for
// every bash command (utils/shell.js getShellConfig), by the name as
// written after "~" (no normalising), so the name must be canonical too.
// The image is pinned and read-only; a link in it leads where the image
// says.
func (sc settingsCheck) shellPath(raw json.RawMessage) {
	var v string
	if json.Unmarshal(raw, &v) != nil {
		sc.refuse("shellPath must be a string")
		return
	}
	if strings.HasPrefix(v, "file://") {
		sc.refuse("shellPath names a file: URL, which Pi decodes as a URL; name the path itself")
		return
	}
	if v == "~" || strings.HasPrefix(v, "~/") {
		v = path.Clean(sandboxHome + "/" + v[1:])
	}
	if code, _ := pathform.Check(v); code != "" {
		sc.refuse("shellPath must be a canonical absolute path in the read-only image (Pi runs it for every bash command)")
		return
	}
	for _, g := range sc.mounts {
		if g.Type != "erofs" && pathform.Beneath(g.Destination, v) {
			sc.refuse("shellPath names a path under %s, which is not the read-only image: Pi runs it for every bash command, so it must be a file no sandbox can write", g.Destination)
			return
		}
	}
}

// piPath mirrors how Pi 1.6.0 on Linux turns a settings path into the one
// it opens (utils/paths.js normalizePath and resolvePath, already trimmed):
// "~" and "~/…" lie in HOME, a relative path lies under base, and the
// result is normalised as Node's path.resolve does. Pi decodes a file://
// URL with fileURLToPath; that is not mirrored, so ok is false for one.
func piPath(v, base string) (p string, ok bool) {
	switch {
	case v == "~":
		v = sandboxHome
	case strings.HasPrefix(v, "~/"):
		v = sandboxHome + v[1:]
	}
	if strings.HasPrefix(v, "file://") {
		return "", false
	}
	if !strings.HasPrefix(v, "/") {
		v = base + "/" + v
	}
	return path.Clean(v), true
}

// isPattern is package-manager.js isPattern: an entry that filters rather
// than names.
func isPattern(s string) bool {
	return strings.HasPrefix(s, "!") || strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-") || strings.ContainsAny(s, "*?")
}

// jsSpace is what JavaScript's String.prototype.trim removes (WhiteSpace
// and LineTerminator), which Pi applies to package and resource paths; Go's
// unicode.IsSpace differs (it has U+0085, lacks U+FEFF).
func jsSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return 0x2000 <= r && r <= 0x200a
}

// npmSpec is Pi's split of an npm: source into name and version
// (package-manager.js parseNpmSpec); without a match the whole spec is the
// name.
var npmSpec = regexp.MustCompile(`^(@?[^@]+(?:/[^@]+)?)(?:@(.+))?$`)

// npmName is a plain npm package name, scoped or not: no "..", no path.
var npmName = regexp.MustCompile(`^(@[A-Za-z0-9~-][A-Za-z0-9._~-]*/)?[A-Za-z0-9~-][A-Za-z0-9._~-]*$`)

// SettingKeys are the settings.json keys the allowlist judges (inert,
// path-checked or refused), sorted: the Pi contract suite (test/picontract)
// checks them against the keys the image's Pi declares.
func SettingKeys() []string { return slices.Sorted(maps.Keys(settingKeys)) }

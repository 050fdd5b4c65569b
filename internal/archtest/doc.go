// Package archtest holds the import rules that keep the architecture's one
// direction (facts → compiler → bundle → launcher) and checks them against
// the module's packages as `go list` reports them (imports_test.go).
// Nothing imports it; its rules are data so a test can feed them synthetic
// edges and watch them fail.
package archtest

package server

import (
	"testing"

	"github.com/yuin/goldmark/ast"
)

// Headings get the ids GitHub gives them, so a link to a section works the
// same on the code host and in the guide. The expected ids are GitHub's
// for these headings of the docs.
func TestGuideHeadingIDsAreGitHubs(t *testing.T) {
	t.Parallel()
	ids := newGitHubIDs()
	for _, c := range []struct{ heading, want string }{
		{"Charges: started → charge_created → finished", "charges-started--charge_created--finished"},
		{"Long-running operations: 202 and poll", "long-running-operations-202-and-poll"},
		{"When the operation writes: `keyed`", "when-the-operation-writes-keyed"},
		{"1. Rename the module", "1-rename-the-module"},
		{"The Idempotency-Key header", "the-idempotency-key-header"},
		{"The figures", "the-figures"},
		{"The figures", "the-figures-1"},
		{"The figures", "the-figures-2"},
	} {
		if got := string(ids.Generate([]byte(c.heading), ast.KindHeading)); got != c.want {
			t.Errorf("%q: id %q; want %q", c.heading, got, c.want)
		}
	}
}

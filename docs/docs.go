// Package docs holds the project's documentation. It is embedded so that
// the server can serve it at /guide/, where the demo page links to it: a
// learner reads why beside what they just saw.
package docs

import "embed"

// Files is the documentation's Markdown files.
//
//go:embed *.md
var Files embed.FS

// Package web holds the browser demo: plain HTML, CSS and one ES module,
// embedded in the server so that `make run` needs no Node build step. The
// page is a real client of the public API; with DEMO_MODE it also uses the
// server's /demo endpoints.
package web

import "embed"

// Files is the UI's static files, and the API reference at /docs/: the
// contract rendered by Redoc, whose bundle (docs/redoc.standalone.js, MIT,
// docs/redoc.LICENSE) is copied from the npm registry at a pinned version
// by `make docs-ui`, with its one outside request (a logo) made inline,
// and checked for drift like generated code.
//
//go:embed index.html style.css app.js docs/index.html docs/redoc.standalone.js docs/redoc.LICENSE
var Files embed.FS

// GuideTemplate is the page around each doc at /guide/ (internal/server).
//
//go:embed guide.html
var GuideTemplate string

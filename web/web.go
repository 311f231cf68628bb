// Package web holds the browser demo: plain HTML, CSS and one ES module,
// embedded in the server so that `make run` needs no Node build step. The
// page is a real client of the public API; with DEMO_MODE it also uses the
// server's /demo endpoints.
package web

import "embed"

// Files is the UI's static files.
//
//go:embed index.html style.css app.js
var Files embed.FS

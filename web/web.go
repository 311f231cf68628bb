// Package web holds the demo UI, embedded so the server needs no Node build
// step. For now it is a placeholder page.
package web

import "embed"

// Files is the UI's static files.
//
//go:embed index.html
var Files embed.FS

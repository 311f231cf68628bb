// Package api holds the hand-written contract, api/openapi.yaml, from which
// internal/apigen is generated. The spec is embedded so the server serves it
// at /openapi.yaml exactly as written.
package api

import _ "embed"

//go:generate go tool oapi-codegen -config oapi-codegen.yaml openapi.yaml
//go:generate go tool oapi-codegen -config oapi-codegen-client.yaml openapi.yaml

// Spec is api/openapi.yaml.
//
//go:embed openapi.yaml
var Spec []byte

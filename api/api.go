// Package api holds the hand-written contract, api/openapi.yaml, from which
// internal/apigen is generated. The spec is embedded so the server serves it
// at /openapi.yaml exactly as written.
package api

import (
	"context"
	_ "embed"

	"github.com/getkin/kin-openapi/openapi3"
)

//go:generate go tool -modfile=../tools/go.mod oapi-codegen -config oapi-codegen.yaml openapi.yaml
//go:generate go tool -modfile=../tools/go.mod oapi-codegen -config oapi-codegen-client.yaml openapi.yaml

// Spec is api/openapi.yaml.
//
//go:embed openapi.yaml
var Spec []byte

// Load parses Spec, the contract exactly as written, and validates it. Use
// it rather than internal/apigen's embedded copy, which oapi-codegen
// normalises (its operationIds are capitalised, for one): the server routes
// and validates requests, and names each keyed record's operation, by the
// contract as it is served at /openapi.yaml.
func Load() (*openapi3.T, error) {
	spec, err := openapi3.NewLoader().LoadFromData(Spec)
	if err != nil {
		return nil, err
	}
	return spec, spec.Validate(context.Background())
}

// Package problem is the API's error vocabulary: RFC 9457 problem details
// with a stable type URI and a machine-readable code per kind of error.
// Domain code returns (or wraps) *problem.Error values, and only the
// server's error handler turns an error into a response: any other error
// is internal, logged once and answered as a generic 500.
package problem

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// TypeBase prefixes every problem type URI. ".example" is reserved for
// documentation (RFC 2606); a fork points it at its own error docs.
const TypeBase = "https://payments.example/problems/"

// ContentType is the media type of every problem response.
const ContentType = "application/problem+json"

// Code is the machine-readable kind of a problem. The list, with the
// codes domain packages Define, is mirrored in api/openapi.yaml
// (Problem.code; TestProblemCodesAreInTheContract checks it).
type Code string

const (
	Unauthorized          Code = "unauthorized"
	InvalidRequest        Code = "invalid_request"
	IdempotencyKeyMissing Code = "idempotency_key_missing"
	IdempotencyKeyInvalid Code = "idempotency_key_invalid"
	IdempotencyKeyInUse   Code = "idempotency_key_in_use"
	IdempotencyKeyReused  Code = "idempotency_key_reused"
	IdempotencyKeyDead    Code = "idempotency_key_dead"
	RequestTooLarge       Code = "request_too_large"
	HeadersTooLarge       Code = "request_header_fields_too_large"
	RateLimited           Code = "rate_limited"
	RequestTimeout        Code = "request_timeout"
	UnsupportedMediaType  Code = "unsupported_media_type"
	CrossOrigin           Code = "cross_origin"
	NotFound              Code = "not_found"
	MethodNotAllowed      Code = "method_not_allowed"
	InvalidSignature      Code = "invalid_signature"
	ProcessorUnavailable  Code = "processor_unavailable"
	InternalError         Code = "internal_error"
	ServiceUnavailable    Code = "service_unavailable"
)

// kind is what a code answers with.
type kind struct {
	status int
	title  string
}

// kinds maps each code to its HTTP status and title: every response's source.
var kinds = map[Code]kind{
	Unauthorized:          {http.StatusUnauthorized, "Unauthorized"},
	InvalidRequest:        {http.StatusBadRequest, "Invalid request"},
	IdempotencyKeyMissing: {http.StatusBadRequest, "Idempotency key missing"},
	IdempotencyKeyInvalid: {http.StatusBadRequest, "Idempotency key invalid"},
	IdempotencyKeyInUse:   {http.StatusConflict, "Idempotency key in use"},
	IdempotencyKeyReused:  {http.StatusUnprocessableEntity, "Idempotency key reused"},
	IdempotencyKeyDead:    {http.StatusConflict, "Operation set aside"},
	RequestTooLarge:       {http.StatusRequestEntityTooLarge, "Request too large"},
	HeadersTooLarge:       {http.StatusRequestHeaderFieldsTooLarge, "Request header fields too large"},
	RateLimited:           {http.StatusTooManyRequests, "Too many requests"},
	RequestTimeout:        {http.StatusRequestTimeout, "Request timeout"},
	UnsupportedMediaType:  {http.StatusUnsupportedMediaType, "Unsupported media type"},
	CrossOrigin:           {http.StatusForbidden, "Cross-origin request refused"},
	NotFound:              {http.StatusNotFound, "Not found"},
	MethodNotAllowed:      {http.StatusMethodNotAllowed, "Method not allowed"},
	InvalidSignature:      {http.StatusBadRequest, "Invalid signature"},
	ProcessorUnavailable:  {http.StatusServiceUnavailable, "Processor unavailable"},
	InternalError:         {http.StatusInternalServerError, "Internal error"},
	ServiceUnavailable:    {http.StatusServiceUnavailable, "Service unavailable"},
}

// Define adds a domain package's own code, declared beside the rule that
// raises it (a package-level var, so before the server starts). A code
// defined twice panics.
func Define(code Code, status int, title string) Code {
	if _, dup := kinds[code]; dup {
		panic("problem: code " + string(code) + " is defined twice")
	}
	kinds[code] = kind{status, title}
	return code
}

// Codes returns every code this package knows, to check against the contract.
func Codes() []Code { return slices.Collect(maps.Keys(kinds)) }

// FieldError names one invalid part of a request by JSON pointer
// ("/amount") or, for a parameter, by its name ("limit").
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is a problem that is also a Go error.
type Error struct {
	Code        Code
	Detail      string
	Errors      []FieldError
	DeclineCode string // the processor's reason for a card_declined problem
	RetryAfter  int    // when positive, sent as the Retry-After header (seconds)
}

// New returns a problem of the given code.
func New(code Code, format string, args ...any) *Error {
	if _, ok := kinds[code]; !ok {
		panic("problem: unknown code " + string(code))
	}
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Detail }

// Status is the HTTP status of the problem.
func (e *Error) Status() int { return kinds[e.Code].status }

// body is the JSON document of RFC 9457, with our extension members.
type body struct {
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	Status      int          `json:"status"`
	Detail      string       `json:"detail,omitempty"`
	Code        Code         `json:"code"`
	Errors      []FieldError `json:"errors,omitempty"`
	DeclineCode string       `json:"decline_code,omitempty"`
}

// JSON is the problem document.
func (e *Error) JSON() []byte {
	k := kinds[e.Code]
	b, err := json.Marshal(body{Type: TypeBase + strings.ReplaceAll(string(e.Code), "_", "-"),
		Title: k.title, Status: k.status, Detail: e.Detail, Code: e.Code,
		Errors: e.Errors, DeclineCode: e.DeclineCode})
	if err != nil { // only strings and ints: cannot happen
		panic(err)
	}
	return b
}

// Header is the problem's response headers.
func (e *Error) Header() http.Header {
	h := http.Header{"Content-Type": {ContentType}}
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	return h
}

// Write writes the problem as an HTTP response.
func (e *Error) Write(w http.ResponseWriter) error {
	maps.Copy(w.Header(), e.Header())
	w.WriteHeader(e.Status())
	_, err := w.Write(e.JSON())
	return err
}

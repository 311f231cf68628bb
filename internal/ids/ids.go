// Package ids makes the public identifiers: opaque strings with a type
// prefix (ord_, ch_, re_, po_, evt_), so that an id says what it names in logs
// and support tickets, and cannot be guessed or enumerated.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// Prefixes of the public ids.
const (
	Order  = "ord"
	Charge = "ch"
	Refund = "re"
	Payout = "po"
	Event  = "evt"
)

var encoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// New returns prefix + "_" + 24 random base32 characters (120 bits).
func New(prefix string) string {
	var b [15]byte
	rand.Read(b[:]) // never returns an error (crypto/rand, Go 1.24+)
	return prefix + "_" + strings.ToLower(encoding.EncodeToString(b[:]))
}

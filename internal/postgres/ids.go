package postgres

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// Prefixes of the public ids, one per table that has them. An id says what
// it names in logs and support tickets (ord_…, ch_…); a table a fork adds
// gets a prefix of its own here, so that no two kinds of row share one.
const (
	PrefixOrder       = "ord"
	PrefixCharge      = "ch"
	PrefixRefund      = "re"
	PrefixPayout      = "po"
	PrefixEvent       = "evt"
	PrefixLedgerEntry = "le"
)

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewID returns a public id: prefix + "_" + 24 random base32 characters
// (120 bits), so that ids cannot be guessed or enumerated.
func NewID(prefix string) string {
	var b [15]byte
	rand.Read(b[:]) // never returns an error (crypto/rand, Go 1.24+)
	return prefix + "_" + strings.ToLower(idEncoding.EncodeToString(b[:]))
}

package postgres

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
)

// IDs declares the prefix of a table's public ids, in the package that
// owns the table (a package-level var, so at start-up), and returns what
// makes them. An id says what it names in logs and support tickets (ord_…,
// ch_…); a prefix declared twice stops the program before it serves, so no
// two kinds of row share one.
func IDs(prefix string) func() string {
	if prefixes[prefix] {
		panic(fmt.Sprintf("postgres: the id prefix %q is declared twice", prefix))
	}
	prefixes[prefix] = true
	return func() string { return NewID(prefix) }
}

var prefixes = map[string]bool{} // written by package initialization only

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewID returns a public id: prefix + "_" + 24 random base32 characters
// (120 bits), so that ids cannot be guessed or enumerated.
func NewID(prefix string) string {
	var b [15]byte
	rand.Read(b[:]) // never returns an error (crypto/rand, Go 1.24+)
	return prefix + "_" + strings.ToLower(idEncoding.EncodeToString(b[:]))
}

// Package ijson refuses JSON that parsers may read differently: an object
// with the same member name twice. RFC 8259 leaves the meaning of
// {"amount": 99999999, "amount": 150} to each parser (Go's encoding/json
// keeps the last, others keep the first or fail), and I-JSON (RFC 7493)
// forbids it. For a payment amount, two parsers that disagree about a
// request (a gateway that checks one value, a service that charges the
// other) are a security problem, so such a request is refused outright.
package ijson

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// DuplicateNameError names the member that appears twice, by JSON pointer
// (RFC 6901), e.g. "/amount" or "/items/0/sku".
type DuplicateNameError struct{ Pointer string }

func (e *DuplicateNameError) Error() string {
	return fmt.Sprintf("the member %s appears more than once in its object", e.Pointer)
}

// CheckUniqueNames reports a *DuplicateNameError for the first object in
// doc that has a member name twice. It does not otherwise judge doc: a
// document that is not JSON is left to the caller's own decoding, and
// reported as nil here.
//
// Names are compared as Go's encoding/json matches them to struct fields:
// after unescaping ("amount" and "\u0061mount" are one member) and without
// regard to case ("type" and "Type" fill the same field, the last one
// winning, while a schema validator sees two members). Either pair is
// refused.
//
// It runs on every request body, so it is a single pass over the bytes
// that allocates only for the names it compares, not a decoder walking
// tokens (which cost a tenth of a replay's CPU time).
func CheckUniqueNames(doc []byte) error {
	s := scanner{doc: doc}
	s.value("")
	return s.dup
}

// pointerEscaper escapes a member name for a JSON pointer (RFC 6901).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

type scanner struct {
	doc []byte
	pos int
	dup error // the duplicate found; also set to stop on malformed input
	bad bool
}

func (s *scanner) stopped() bool { return s.dup != nil || s.bad }

func (s *scanner) skipSpace() {
	for s.pos < len(s.doc) {
		switch s.doc[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// value reads one value; path is its pointer.
func (s *scanner) value(path string) {
	s.skipSpace()
	if s.pos >= len(s.doc) {
		s.bad = true
		return
	}
	switch s.doc[s.pos] {
	case '{':
		s.object(path)
	case '[':
		s.array(path)
	case '"':
		s.str()
	default: // a number, true, false or null: up to the next delimiter
		start := s.pos
		for s.pos < len(s.doc) && !strings.ContainsRune(",]}: \t\n\r", rune(s.doc[s.pos])) {
			s.pos++
		}
		if s.pos == start { // a delimiter where a value should be
			s.bad = true
		}
	}
}

func (s *scanner) object(path string) {
	s.pos++            // '{'
	var names []string // objects are small: a slice beats a map
	for !s.stopped() {
		s.skipSpace()
		if s.pos < len(s.doc) && s.doc[s.pos] == '}' {
			s.pos++
			return
		}
		if s.pos >= len(s.doc) || s.doc[s.pos] != '"' {
			s.bad = true
			return
		}
		name, ok := s.str()
		if !ok {
			return
		}
		member := path + "/" + pointerEscaper.Replace(name)
		for _, n := range names {
			if strings.EqualFold(n, name) {
				s.dup = &DuplicateNameError{Pointer: member}
				return
			}
		}
		names = append(names, name)
		s.skipSpace()
		if s.pos >= len(s.doc) || s.doc[s.pos] != ':' {
			s.bad = true
			return
		}
		s.pos++
		s.value(member)
		s.separator('}')
	}
}

// separator moves past the ',' after a member or element; the closing
// delimiter is left for the caller's loop, and anything else is malformed.
func (s *scanner) separator(closing byte) {
	if s.stopped() {
		return
	}
	s.skipSpace()
	switch {
	case s.pos < len(s.doc) && s.doc[s.pos] == ',':
		s.pos++
	case s.pos < len(s.doc) && s.doc[s.pos] == closing:
	default:
		s.bad = true
	}
}

func (s *scanner) array(path string) {
	s.pos++ // '['
	for i := 0; !s.stopped(); i++ {
		s.skipSpace()
		if s.pos < len(s.doc) && s.doc[s.pos] == ']' {
			s.pos++
			return
		}
		s.value(path + "/" + strconv.Itoa(i))
		s.separator(']')
	}
}

// str reads a string at s.pos and returns its unescaped value.
func (s *scanner) str() (string, bool) {
	start := s.pos
	s.pos++ // '"'
	escaped := false
	for s.pos < len(s.doc) {
		switch s.doc[s.pos] {
		case '\\':
			escaped = true
			s.pos += 2
			continue
		case '"':
			s.pos++
			raw := s.doc[start:s.pos]
			if !escaped {
				return string(raw[1 : len(raw)-1]), true
			}
			var v string
			if err := json.Unmarshal(raw, &v); err != nil {
				s.bad = true
				return "", false
			}
			return v, true
		}
		s.pos++
	}
	s.bad = true
	return "", false
}

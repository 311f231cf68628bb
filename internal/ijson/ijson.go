// Package ijson refuses JSON that parsers may read differently, or that
// costs more to read than its size: an object with the same member name
// twice, and nesting deeper than MaxDepth.
//
// RFC 8259 leaves the meaning of {"amount": 99999999, "amount": 150} to each
// parser (Go's encoding/json keeps the last, others keep the first or fail),
// and I-JSON (RFC 7493) forbids it. For a payment amount, two parsers that
// disagree about a request (a gateway that checks one value, a service that
// charges the other) are a security problem, so such a request is refused
// outright.
//
// The check runs on every request body before anything else reads it, the
// processor's unauthenticated webhook included, so its own cost must be
// bounded by the body's size: one pass over the bytes, recursion no deeper
// than MaxDepth, member names compared through a map once an object has
// more than a few, and a JSON pointer built only for the one duplicate it
// reports.
package ijson

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of objects and arrays a document may have.
// The API's bodies are two levels deep; 32 leaves room for a fork's richer
// bodies while keeping every parser after this one (the validator, the
// decoder, the fingerprint) far from a recursion that costs real memory.
const MaxDepth = 32

// MaxValues is the most values (objects, arrays, strings, numbers,
// literals) one document may hold. The API's bodies hold a handful. Every
// parser after this one builds something for each value (the validator
// decodes the whole document before it looks at its type), so 64 KiB of
// tiny values would cost many times what it took to send.
const MaxValues = 1024

// MaxMembers is the most members one object may have. The API's objects
// have a handful; a validator that reports every member a schema does not
// allow spends real time on each, so a 64 KiB object with thousands of
// them would cost far more to answer than to send.
const MaxMembers = 100

// MaxString is the longest string a document may hold, names included, in
// characters as written: a character, or an escape, counts one (so an
// escaped surrogate pair counts two). The API's longest string is a
// 500-character description; a validator matches patterns over every
// string it is given, so a 64 KiB one costs milliseconds. It is counted in
// characters, not bytes, because a limit of the body's form must never
// refuse what the contract allows: 500 emoji, escaped as most encoders
// write them, are 6,000 bytes.
const MaxString = 4096

// StringError is a string longer than MaxString; Pointer names it (or, for
// a member name, its member).
type StringError struct {
	Limit   int
	Pointer string
}

func (e *StringError) Error() string {
	return fmt.Sprintf("the string at %s is longer than %d characters", e.Pointer, e.Limit)
}

// DuplicateNameError names the member that appears twice, by JSON pointer
// (RFC 6901), e.g. "/amount" or "/items/0/sku".
type DuplicateNameError struct{ Pointer string }

func (e *DuplicateNameError) Error() string {
	return fmt.Sprintf("the member %s appears more than once in its object", e.Pointer)
}

// DepthError is a document nested deeper than MaxDepth; Pointer names the
// value that went one level too deep.
type DepthError struct {
	Limit   int
	Pointer string
}

func (e *DepthError) Error() string {
	return fmt.Sprintf("the value at %s is nested more than %d levels deep", e.Pointer, e.Limit)
}

// ValuesError is a document with more than MaxValues values; Pointer
// names the value past the limit.
type ValuesError struct {
	Limit   int
	Pointer string
}

func (e *ValuesError) Error() string {
	return fmt.Sprintf("the document holds more than %d values (the one past the limit is at %s)", e.Limit, e.Pointer)
}

// EncodingError is a string that is not Unicode text: invalid UTF-8, or a
// \u escape of a lone surrogate (U+D800 to U+DFFF not in a pair). Go's
// decoder, like most, reads either as U+FFFD, so two different bodies would
// read, and be fingerprinted, as one; I-JSON (RFC 7493) forbids both.
// Pointer names the string (or, for a member name, its object).
type EncodingError struct{ Pointer string }

func (e *EncodingError) Error() string {
	return fmt.Sprintf("the string at %s is not valid Unicode (invalid UTF-8, or a lone surrogate escape)", e.Pointer)
}

// MembersError is an object with more than MaxMembers members; Pointer
// names the object.
type MembersError struct {
	Limit   int
	Pointer string
}

func (e *MembersError) Error() string {
	return fmt.Sprintf("the object at %s has more than %d members", e.Pointer, e.Limit)
}

// Check reports a *DepthError for a document nested deeper than MaxDepth,
// a *ValuesError for one with more than MaxValues values, a *MembersError
// for an object with more than MaxMembers members, a *StringError for a
// string longer than MaxString, an *EncodingError for a string that is not
// Unicode text, or a *DuplicateNameError for the first
// object in doc that has a member name twice, whichever the scan meets
// first. It does not otherwise judge
// doc: a document that is not JSON is left to the caller's own decoding,
// and reported as nil here.
//
// Names are compared as Go's encoding/json matches them to struct fields:
// after unescaping ("amount" and "\u0061mount" are one member) and without
// regard to case ("type" and "Type" fill the same field, the last one
// winning, while a schema validator sees two members). Either pair is
// refused.
func Check(doc []byte) error {
	s := scanner{doc: doc}
	s.value(0)
	return s.err
}

type scanner struct {
	doc    []byte
	pos    int
	err    error // the problem found; it stops the scan
	bad    bool  // malformed input: stops the scan, reported as nil
	values int   // the values met so far
	// path holds the member names and element indexes that lead to the
	// value being read, so that a pointer can be built when one is needed.
	// It never grows past MaxDepth.
	path []step
	// scratch holds an escaped name while it is hashed.
	scratch []byte
	// seed keys the hashes that large objects compare names by: random per
	// scan, so that nobody can choose names whose hashes collide. folded
	// holds a name's folded form while it is hashed.
	seed   maphash.Seed
	folded []byte
}

// step is one level of path: a member's name (where it is in doc), or an
// element's index (index ≥ 0).
type step struct {
	name  name
	index int
}

// name is a member name as it appears in doc: the bytes between its
// quotes, and whether they hold an escape. It is unescaped only when two
// names must be compared exactly, or a pointer built, so that reading a
// name costs no allocation.
type name struct {
	start, end int
	escaped    bool
}

func (s *scanner) stopped() bool { return s.err != nil || s.bad }

// text is n unescaped: a slice of doc when n has no escape; otherwise a
// fresh slice.
func (s *scanner) text(n name) []byte {
	raw := s.doc[n.start:n.end]
	if !n.escaped {
		return raw
	}
	out, _ := unescape(nil, raw) // n was checked when it was read
	return out
}

// pointer renders path as a JSON pointer.
func (s *scanner) pointer() string {
	var b strings.Builder
	for _, st := range s.path {
		b.WriteByte('/')
		if st.index >= 0 {
			b.WriteString(strconv.Itoa(st.index))
		} else {
			b.WriteString(pointerEscaper.Replace(string(s.text(st.name))))
		}
	}
	return b.String()
}

// pointerEscaper escapes a member name for a JSON pointer (RFC 6901).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

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

// value reads one value, depth levels inside the document.
func (s *scanner) value(depth int) {
	s.skipSpace()
	if s.pos >= len(s.doc) {
		s.bad = true
		return
	}
	if s.values++; s.values > MaxValues {
		s.err = &ValuesError{Limit: MaxValues, Pointer: s.pointer()}
		return
	}
	switch c := s.doc[s.pos]; c {
	case '{', '[':
		if depth == MaxDepth {
			s.err = &DepthError{Limit: MaxDepth, Pointer: s.pointer()}
			return
		}
		if c == '{' {
			s.object(depth + 1)
		} else {
			s.array(depth + 1)
		}
	case '"':
		s.str()
	default: // a number, true, false or null: up to the next delimiter
		start := s.pos
		for s.pos < len(s.doc) && !isDelimiter(s.doc[s.pos]) {
			s.pos++
		}
		if s.pos == start { // a delimiter where a value should be
			s.bad = true
		}
	}
}

func isDelimiter(c byte) bool {
	switch c {
	case ',', ']', '}', ':', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// smallObject is how many names an object's check compares one by one
// before it switches to hashing them: a handful of comparisons is cheaper
// than hashing, but an object with thousands of members would make them
// quadratic.
const smallObject = 16

func (s *scanner) object(depth int) {
	s.pos++            // '{'
	var names [][]byte // the names so far, unescaped, while the object is small
	// byHash, once it is not: the hash of each name's folded form. Equal
	// names have equal hashes.
	var byHash map[uint64]struct{}
	for members := 0; !s.stopped(); members++ {
		s.skipSpace()
		if s.pos < len(s.doc) && s.doc[s.pos] == '}' {
			s.pos++
			return
		}
		if s.pos >= len(s.doc) || s.doc[s.pos] != '"' {
			s.bad = true
			return
		}
		if members == MaxMembers {
			s.err = &MembersError{Limit: MaxMembers, Pointer: s.pointer()}
			return
		}
		n, ok := s.str()
		if !ok {
			return
		}
		s.path = append(s.path, step{name: n, index: -1})
		var text []byte
		switch {
		case !n.escaped:
			text = s.doc[n.start:n.end]
		case byHash != nil:
			text = s.scratch // str decoded it there
		default:
			text = bytes.Clone(s.scratch) // kept in names
		}
		if seen(text, names, byHash, s) {
			s.err = &DuplicateNameError{Pointer: s.pointer()}
			return
		}
		switch {
		case byHash != nil:
			byHash[s.foldHash(text)] = struct{}{}
		case len(names) < smallObject:
			names = append(names, text)
		default:
			if s.seed == (maphash.Seed{}) {
				s.seed = maphash.MakeSeed()
			}
			byHash = make(map[uint64]struct{}, 2*smallObject)
			for _, m := range append(names, text) {
				byHash[s.foldHash(m)] = struct{}{}
			}
			names = nil
		}
		s.skipSpace()
		if s.pos >= len(s.doc) || s.doc[s.pos] != ':' {
			s.bad = true
			return
		}
		s.pos++
		s.value(depth)
		s.path = s.path[:len(s.path)-1]
		s.separator('}')
	}
}

// seen reports whether text equals, ignoring case as encoding/json does,
// one of the names before it in its object: those in names, or those
// hashed in byHash.
func seen(text []byte, names [][]byte, byHash map[uint64]struct{}, s *scanner) bool {
	if byHash != nil {
		// Two different names share a 64-bit hash keyed by a random seed
		// with a chance of 2⁻⁶⁴; should it happen, the second is taken
		// for a duplicate and the request refused, which is safe.
		_, ok := byHash[s.foldHash(text)]
		return ok
	}
	for _, m := range names {
		if bytes.EqualFold(m, text) {
			return true
		}
	}
	return false
}

// foldHash hashes a name's folded form: every rune replaced by the smallest
// rune of its case-folding orbit (k, K and the Kelvin sign K all become
// K), so that two names hash alike when bytes.EqualFold says they are
// equal, which is how encoding/json matches member names to fields.
func (s *scanner) foldHash(text []byte) uint64 {
	folded := s.folded[:0]
	for i := 0; i < len(text); {
		if c := text[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A' // an ASCII letter's orbit starts with its capital
			}
			folded = append(folded, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(text[i:])
		i += size
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		folded = utf8.AppendRune(folded, least)
	}
	s.folded = folded
	return maphash.Bytes(s.seed, folded)
}

func (s *scanner) array(depth int) {
	s.pos++ // '['
	for i := 0; !s.stopped(); i++ {
		s.skipSpace()
		if s.pos < len(s.doc) && s.doc[s.pos] == ']' {
			s.pos++
			return
		}
		s.path = append(s.path, step{index: i})
		s.value(depth)
		s.path = s.path[:len(s.path)-1]
		s.separator(']')
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

// str moves past the string at s.pos and says where its text is. A string
// with an escape must decode (a name is compared after unescaping), and
// every string must be Unicode text, which is checked here, once.
func (s *scanner) str() (name, bool) {
	s.pos++ // '"'
	n := name{start: s.pos}
	for chars := 0; s.pos < len(s.doc); chars++ {
		if chars > MaxString {
			// Too long already: no need to find where it ends.
			s.err = &StringError{Limit: MaxString, Pointer: s.pointer()}
			return n, false
		}
		switch c := s.doc[s.pos]; {
		case c == '\\':
			n.escaped = true
			if s.pos+1 < len(s.doc) && s.doc[s.pos+1] == 'u' {
				s.pos += 4 // its four digits, which unescape checks
			}
			s.pos += 2
		case c == '"':
			n.end = s.pos
			s.pos++
			if n.escaped {
				var err error
				if s.scratch, err = unescape(s.scratch[:0], s.doc[n.start:n.end]); err == errNotUnicode {
					s.err = &EncodingError{Pointer: s.pointer()}
					return n, false
				} else if err != nil {
					s.bad = true
					return n, false
				}
			}
			return n, true
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(s.doc[s.pos:])
			if r == utf8.RuneError && size == 1 {
				s.err = &EncodingError{Pointer: s.pointer()}
				return n, false
			}
			s.pos += size
		default:
			s.pos++
		}
	}
	s.bad = true
	return n, false
}

var (
	errMalformed  = errors.New("ijson: not a JSON string")
	errNotUnicode = errors.New("ijson: a lone surrogate")
)

// unescape appends the text of a JSON string's raw contents (between the
// quotes, valid UTF-8) to dst, decoding escapes exactly as encoding/json
// does, but for a lone or broken surrogate, which it refuses
// (errNotUnicode) where encoding/json reads U+FFFD. It returns errMalformed
// for an escape JSON does not have. (encoding/json's own decoder would do,
// but it allocates its state for every string, and a body can hold
// thousands of names.)
func unescape(dst, raw []byte) ([]byte, error) {
	dst = slices.Grow(dst, len(raw)) // escapes only shrink it
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		if i+1 >= len(raw) {
			return dst, errMalformed
		}
		switch e := raw[i+1]; e {
		case '"', '\\', '/':
			dst = append(dst, e)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(raw[i+2:])
			if !ok {
				return dst, errMalformed
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if i+1 >= len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
					return dst, errNotUnicode
				}
				r2, ok := hex4(raw[i+2:])
				if !ok {
					return dst, errMalformed
				}
				if r = utf16.DecodeRune(r, r2); r == unicode.ReplacementChar {
					return dst, errNotUnicode
				}
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			return dst, errMalformed
		}
		i += 2
	}
	return dst, nil
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

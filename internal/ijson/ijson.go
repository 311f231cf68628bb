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
// bounded by the body's size: one pass over the bytes with jsontext (the
// tokenizer of Go's JSON v2, which reads a bytes.Buffer in place), and no
// level, value, member or string past the limits below.
package ijson

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
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
// a member name, its object).
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
// Unicode text, or a *DuplicateNameError for the first object in doc that
// has a member name twice, whichever the scan meets first. It does not
// otherwise judge doc: a document that is not JSON is left to the caller's
// own decoding, and reported as nil here.
//
// Names are compared as Go's encoding/json matches them to struct fields:
// after unescaping ("amount" and "\u0061mount" are one member) and without
// regard to case ("type" and "Type" fill the same field, the last one
// winning, while a schema validator sees two members). Either pair is
// refused.
func Check(doc []byte) error {
	// Duplicates and bad Unicode are let through the tokenizer, to be
	// found below, where they are reported with the pointer and the case
	// folding above.
	dec := jsontext.NewDecoder(bytes.NewBuffer(doc), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	var path []level // the objects and arrays around the next token
	values := 0
	for {
		kind := dec.PeekKind()
		if kind == 0 { // the end, or not JSON: the caller's decoder says which
			return nil
		}
		if kind == '}' || kind == ']' {
			if _, err := dec.ReadToken(); err != nil {
				return nil
			}
			path = path[:len(path)-1]
			next(path)
			continue
		}
		if n := len(path); n > 0 && path[n-1].object && path[n-1].wantName {
			switch err := name(dec, path); err {
			case nil:
				continue
			case errNotJSON:
				return nil
			default:
				return err
			}
		}
		if values++; values > MaxValues {
			return &ValuesError{Limit: MaxValues, Pointer: pointer(path)}
		}
		switch kind {
		case '{', '[':
			if len(path) == MaxDepth {
				return &DepthError{Limit: MaxDepth, Pointer: pointer(path)}
			}
			if _, err := dec.ReadToken(); err != nil {
				return nil
			}
			path = append(path, level{object: kind == '{', wantName: kind == '{'})
			continue
		case '"':
			raw, err := dec.ReadValue()
			if err != nil {
				return nil
			}
			if err := checkString(raw, path); err != nil {
				return err
			}
		default:
			if err := dec.SkipValue(); err != nil {
				return nil
			}
		}
		next(path)
	}
}

// level is one object or array around the token being read: an object's
// member names so far (folded) and the current one, or an array's index.
type level struct {
	object   bool
	wantName bool     // an object whose next token is a name (or its end)
	names    []string // folded, to compare (at most MaxMembers)
	name     string   // the current member's name, as the pointer shows it
	index    int
}

// next moves the innermost level past the value just read.
func next(path []level) {
	if n := len(path); n > 0 {
		if path[n-1].object {
			path[n-1].wantName = true
		} else {
			path[n-1].index++
		}
	}
}

// errNotJSON is name's answer for a document that is not JSON.
var errNotJSON = errors.New("ijson: not JSON")

// name reads the next member name of the object at the end of path.
func name(dec *jsontext.Decoder, path []level) error {
	obj := &path[len(path)-1]
	if len(obj.names) == MaxMembers {
		return &MembersError{Limit: MaxMembers, Pointer: pointer(path[:len(path)-1])}
	}
	raw, err := dec.ReadValue()
	if err != nil {
		return errNotJSON
	}
	if err := checkString(raw, path[:len(path)-1]); err != nil { // a name's problem is its object's

		return err
	}
	text, err := jsontext.AppendUnquote(nil, raw)
	if err != nil {
		return errNotJSON
	}
	obj.name, obj.wantName = string(text), false
	// A linear search: an object has at most MaxMembers names.
	folded := fold(text)
	if slices.Contains(obj.names, folded) {
		return &DuplicateNameError{Pointer: pointer(path)}
	}
	obj.names = append(obj.names, folded)
	return nil
}

// pointer renders path as a JSON pointer (RFC 6901).
func pointer(path []level) string {
	var b strings.Builder
	for _, l := range path {
		b.WriteByte('/')
		if l.object {
			b.WriteString(pointerEscaper.Replace(l.name))
		} else {
			b.WriteString(strconv.Itoa(l.index))
		}
	}
	return b.String()
}

// pointerEscaper escapes a member name for a JSON pointer (RFC 6901).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// checkString checks the quoted JSON string raw: at most MaxString
// characters as written (a character, or an escape, counts one), and
// Unicode text: valid UTF-8, and no \u escape of a lone surrogate (which
// encoding/json, like most decoders, reads as U+FFFD, so that different
// bodies would read, and be fingerprinted, as one). Its errors name the
// string as at.
func checkString(raw []byte, at []level) error {
	s := raw[1 : len(raw)-1]
	chars := 0
	for ; len(s) > 0; chars++ {
		if chars >= MaxString {
			return &StringError{Limit: MaxString, Pointer: pointer(at)}
		}
		switch {
		case s[0] == '\\' && s[1] == 'u':
			r, _ := strconv.ParseUint(string(s[2:6]), 16, 16)
			s = s[6:]
			if !utf16.IsSurrogate(rune(r)) {
				continue
			}
			// A high surrogate, then a \u escape of a low one: two
			// characters as written.
			var low uint64
			if len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
				low, _ = strconv.ParseUint(string(s[2:6]), 16, 16)
			}
			if utf16.DecodeRune(rune(r), rune(low)) == unicode.ReplacementChar {
				return &EncodingError{Pointer: pointer(at)}
			}
			s, chars = s[6:], chars+1
		case s[0] == '\\':
			s = s[2:]
		default:
			r, size := utf8.DecodeRune(s)
			if r == utf8.RuneError && size == 1 {
				return &EncodingError{Pointer: pointer(at)}
			}
			s = s[size:]
		}
	}
	if chars > MaxString { // a surrogate pair, two characters, came last
		return &StringError{Limit: MaxString, Pointer: pointer(at)}
	}
	return nil
}

// fold is a name's folded form: every rune replaced by the smallest rune
// of its case-folding orbit (k, K and the Kelvin sign K all become K), so
// that two names fold alike exactly when bytes.EqualFold says they are
// equal, which is how encoding/json matches member names to fields.
func fold(text []byte) string {
	folded := make([]byte, 0, len(text))
	for _, r := range string(text) {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		folded = utf8.AppendRune(folded, least)
	}
	return string(folded)
}

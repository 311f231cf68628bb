// Package ijson refuses JSON that parsers may read differently, or that
// costs more to read than its size: a member name twice in an object, text
// that is not Unicode, and anything past the limits below.
//
// RFC 8259 leaves the meaning of {"amount": 99999999, "amount": 150} to each
// parser (Go's encoding/json keeps the last, others the first or fail), and
// I-JSON (RFC 7493) forbids it: two parsers that disagree about a payment (a
// gateway checks one amount, a service charges the other) are a security
// problem.
//
// The check runs on every request body first, the unauthenticated webhook
// included, so its own cost is bounded by the body's size: one pass with
// jsontext (Go's JSON v2 tokenizer, reading a bytes.Buffer in place).
package ijson

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// The limits. The API's bodies are far inside them; each keeps what the
// parsers after this one (the validator, the decoder, the fingerprint)
// spend on a 64 KiB body near what it cost to send.
const (
	// MaxDepth is the deepest nesting of objects and arrays: the API's
	// bodies are two levels deep, and 32 leaves room for a fork's, far from
	// a recursion that costs real memory.
	MaxDepth = 32
	// MaxValues is the most values (objects, arrays, strings, numbers,
	// literals) in a document: every later parser builds something for
	// each (the validator decodes the whole document first).
	MaxValues = 1024
	// MaxMembers is the most members of one object: a validator spends
	// real time on each member a schema does not allow.
	MaxMembers = 100
	// MaxString is the longest string, names included, in characters as
	// written (a character or an escape counts one, an escaped surrogate
	// pair two): a validator matches patterns over every string. The
	// longest the API takes is a 500-character description; it counts
	// characters, not bytes, so as never to refuse what the contract
	// allows (500 escaped emoji are 6,000 bytes).
	MaxString = 4096
)

// StringError is a string longer than MaxString.
type StringError struct {
	Limit   int
	Pointer string
}

func (e *StringError) Error() string {
	return fmt.Sprintf("the string at %s is longer than %d characters", e.Pointer, e.Limit)
}

// DuplicateNameError is a member name twice in one object.
type DuplicateNameError struct{ Pointer string }

func (e *DuplicateNameError) Error() string {
	return fmt.Sprintf("the member %s appears more than once in its object", e.Pointer)
}

// DepthError is a value nested deeper than MaxDepth.
type DepthError struct {
	Limit   int
	Pointer string
}

func (e *DepthError) Error() string {
	return fmt.Sprintf("the value at %s is nested more than %d levels deep", e.Pointer, e.Limit)
}

// ValuesError is the value past MaxValues in a document.
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
type EncodingError struct{ Pointer string }

func (e *EncodingError) Error() string {
	return fmt.Sprintf("the string at %s is not valid Unicode (invalid UTF-8, or a lone surrogate escape)", e.Pointer)
}

// MembersError is an object with more than MaxMembers members.
type MembersError struct {
	Limit   int
	Pointer string
}

func (e *MembersError) Error() string {
	return fmt.Sprintf("the object at %s has more than %d members", e.Pointer, e.Limit)
}

// Check reports the first problem its scan of doc meets, as a *DepthError,
// *ValuesError, *MembersError, *StringError, *EncodingError or
// *DuplicateNameError, whose Pointer names the value by JSON pointer (RFC
// 6901), e.g. "/items/0/sku" (a member name's problem is its object's). A
// document that is not JSON is left to the caller's decoding: nil here.
//
// Names are compared as Go's encoding/json matches them to struct fields:
// after unescaping ("amount" and "\u0061mount" are one member) and without
// regard to case ("type" and "Type" fill the same field, the last one
// winning, while a schema validator sees two members). Either pair is
// refused.
func Check(doc []byte) error {
	// The tokenizer lets duplicates and bad Unicode through: they are found
	// below, with the pointer and the case folding above.
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
			if stop, err := name(dec, path); stop {
				return err
			}
			continue
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

// level is one object or array around the token being read.
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

// name reads the next member name of the object at the end of path. stop
// says Check is done: err is what it reports (nil for a document that is
// not JSON).
func name(dec *jsontext.Decoder, path []level) (stop bool, err error) {
	obj, at := &path[len(path)-1], path[:len(path)-1] // a name's problem is its object's
	if len(obj.names) == MaxMembers {
		return true, &MembersError{Limit: MaxMembers, Pointer: pointer(at)}
	}
	raw, err := dec.ReadValue()
	if err != nil {
		return true, nil
	}
	if err := checkString(raw, at); err != nil {
		return true, err
	}
	text, err := jsontext.AppendUnquote(nil, raw)
	if err != nil {
		return true, nil
	}
	obj.name, obj.wantName = string(text), false
	// A linear search: an object has at most MaxMembers names.
	folded := fold(text)
	if slices.Contains(obj.names, folded) {
		return true, &DuplicateNameError{Pointer: pointer(path)}
	}
	obj.names = append(obj.names, folded)
	return false, nil
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
// characters as written, and Unicode text (see EncodingError). Its errors
// name the string as at.
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

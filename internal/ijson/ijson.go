// Package ijson refuses JSON that parsers may read differently: an object
// with the same member name twice. RFC 8259 leaves the meaning of
// {"amount": 99999999, "amount": 150} to each parser (Go's encoding/json
// keeps the last, others keep the first or fail), and I-JSON (RFC 7493)
// forbids it. For a payment amount, two parsers that disagree about a
// request (a gateway that checks one value, a service that charges the
// other) are a security problem, so such a request is refused outright.
package ijson

import (
	"bytes"
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
func CheckUniqueNames(doc []byte) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	err := walk(dec, "")
	if _, dup := err.(*DuplicateNameError); dup {
		return err
	}
	return nil
}

// walk reads one value from dec; path is its pointer.
func walk(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			nameTok, err := dec.Token()
			if err != nil {
				return err
			}
			name, _ := nameTok.(string)
			member := path + "/" + escape(name)
			// Names are compared after unescaping, as a parser sees them:
			// "amount" and "\u0061mount" are the same member.
			if seen[name] {
				return &DuplicateNameError{Pointer: member}
			}
			seen[name] = true
			if err := walk(dec, member); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := walk(dec, path+"/"+strconv.Itoa(i)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil
}

func escape(name string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
}

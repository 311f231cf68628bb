package ijson

import (
	"errors"
	"testing"
)

func TestCheckUniqueNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		doc     string
		pointer string // "" when the document must be accepted
	}{
		{`{"amount":150,"currency":"usd"}`, ""},
		{`{"amount":99999999,"amount":150}`, "/amount"},
		{`{"amount":1,"\u0061mount":2}`, "/amount"}, // the same name once unescaped
		{`{"a":{"b":1,"b":2}}`, "/a/b"},
		{`{"a":[{"x":1},{"x":1,"x":2}]}`, "/a/1/x"},
		{`{"a/b":1,"a/b":2}`, "/a~1b"},
		{`{"type":"charge.failed","Type":"charge.succeeded"}`, "/Type"}, // one struct field to encoding/json
		{`{"a":{"b":1},"b":{"a":1}}`, ""},                               // the same names in different objects
		{`[{"k":1},{"k":2}]`, ""},
		{`not json`, ""},     // left to the caller's decoder
		{`{"a":1,"a"`, "/a"}, // the second name is a duplicate, however the document ends
		{``, ""},
	} {
		err := CheckUniqueNames([]byte(tc.doc))
		var dup *DuplicateNameError
		switch {
		case tc.pointer == "" && err != nil:
			t.Errorf("%s: %v; want accepted", tc.doc, err)
		case tc.pointer != "" && (!errors.As(err, &dup) || dup.Pointer != tc.pointer):
			t.Errorf("%s: %v; want a duplicate at %s", tc.doc, err, tc.pointer)
		}
	}
}

func FuzzCheckUniqueNames(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"a":[{"b":1}]}`, `[]`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		_ = CheckUniqueNames(doc) // must not panic or hang
	})
}

package ijson

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		doc     string
		pointer string // "" when the document must be accepted
		depth   bool   // the problem is the nesting, not a duplicate
	}{
		{`{"amount":150,"currency":"usd"}`, "", false},
		{`{"amount":99999999,"amount":150}`, "/amount", false},
		{`{"amount":1,"\u0061mount":2}`, "/amount", false}, // the same name once unescaped
		{`{"a":{"b":1,"b":2}}`, "/a/b", false},
		{`{"a":[{"x":1},{"x":1,"x":2}]}`, "/a/1/x", false},
		{`{"a/b":1,"a/b":2}`, "/a~1b", false},
		{`{"type":"charge.failed","Type":"charge.succeeded"}`, "/Type", false}, // one struct field to encoding/json
		{"{\"k\":1,\"\u212a\":2}", "/\u212a", false},                           // the Kelvin sign folds to k, as in encoding/json
		{"{\"\u00e9\":1,\"\u00c9\":2}", "/\u00c9", false},                      // valid non-ASCII folds as before
		{`{"a":{"b":1},"b":{"a":1}}`, "", false},                               // the same names in different objects
		{`[{"k":1},{"k":2}]`, "", false},
		{`not json`, "", false},     // left to the caller's decoder
		{`{"a":1,"a"`, "/a", false}, // the second name is a duplicate, however the document ends
		{``, "", false},
		{deep(MaxDepth), "", false},
		{deep(MaxDepth + 1), "/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0", true},
		{`{"a":` + deep(MaxDepth) + `}`, "/a" + strings.Repeat("/0", MaxDepth-1), true},
		{strings.Repeat("[", 1<<16), strings.Repeat("/0", MaxDepth), true}, // malformed too, but too deep first
	} {
		err := Check([]byte(tc.doc))
		var dup *DuplicateNameError
		var tooDeep *DepthError
		name := tc.doc
		if len(name) > 80 {
			name = name[:80] + "…"
		}
		switch {
		case tc.pointer == "" && err != nil:
			t.Errorf("%s: %v; want accepted", name, err)
		case tc.pointer != "" && tc.depth && (!errors.As(err, &tooDeep) || tooDeep.Pointer != tc.pointer || tooDeep.Limit != MaxDepth):
			t.Errorf("%s: %v; want too deep at %s", name, err, tc.pointer)
		case tc.pointer != "" && !tc.depth && (!errors.As(err, &dup) || dup.Pointer != tc.pointer):
			t.Errorf("%s: %v; want a duplicate at %s", name, err, tc.pointer)
		}
	}
}

// A string that is not Unicode text is refused, where a decoder would read
// U+FFFD: otherwise different bodies read, and are fingerprinted, as one
// ("\ud800" and "\udfff" and a raw 0xff byte would all be the same
// description).
func TestCheckRefusesWhatIsNotUnicode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, pointer string }{
		{`{"description":"\ud83d"}`, "/description"},       // a lone high surrogate
		{`{"description":"\ude00"}`, "/description"},       // a lone low surrogate
		{`{"description":"\ud83dx"}`, "/description"},      // a high one, then no escape
		{`{"description":"\ud83d\u0041"}`, "/description"}, // a high one, then not a low one
		{"{\"description\":\"\xff\"}", "/description"},     // invalid UTF-8
		{"{\"description\":\"a\xc3\"}", "/description"},    // a sequence cut short
		{"[\"ok\",\"\xed\xa0\x80\"]", "/1"},                // a surrogate encoded as UTF-8
		{"{\"\x9e\":1}", ""},                               // in a member name: its object
	} {
		var notUnicode *EncodingError
		if err := Check([]byte(tc.doc)); !errors.As(err, &notUnicode) || notUnicode.Pointer != tc.pointer {
			t.Errorf("%q: %v; want not Unicode at %q", tc.doc, err, tc.pointer)
		}
	}
	for _, doc := range []string{`{"description":"\ud83d\ude00"}`, "{\"description\":\"\U0001F600 \u00e9\"}", `{"d":"\uffff"}`} {
		if err := Check([]byte(doc)); err != nil {
			t.Errorf("%q: %v; want accepted", doc, err)
		}
	}
}

func TestCheckBoundsValuesMembersAndStrings(t *testing.T) {
	t.Parallel()
	members := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"a":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"m%d":%d`, i, i)
		}
		b.WriteString("}}")
		return b.String()
	}
	values := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("0,", n-1), ",") + "]" } // the array is a value too
	if err := Check([]byte(values(MaxValues))); err != nil {
		t.Errorf("%d values: %v", MaxValues, err)
	}
	var many *ValuesError
	if err := Check([]byte(values(MaxValues + 1))); !errors.As(err, &many) || many.Pointer != fmt.Sprintf("/%d", MaxValues-1) {
		t.Errorf("%d values: %v; want too many values at /%d", MaxValues+1, err, MaxValues-1)
	}
	long := func(n int) string { return `{"a":["` + strings.Repeat("x", n) + `"]}` }
	if err := Check([]byte(long(MaxString))); err != nil {
		t.Errorf("a %d-character string: %v", MaxString, err)
	}
	var tooLong *StringError
	if err := Check([]byte(long(MaxString + 1))); !errors.As(err, &tooLong) || tooLong.Pointer != "/a/0" {
		t.Errorf("a %d-character string: %v; want too long at /a/0", MaxString+1, err)
	}
	// Characters, however they are written: raw four-byte ones, \u
	// escapes, escaped surrogate pairs (two each). A byte limit refused
	// the contract's own longest string written by a common encoder.
	for _, c := range []struct {
		char string
		n    int
	}{{"😀", MaxString}, {`\u00e9`, MaxString}, {`\ud83d\ude00`, MaxString / 2}, {`\n`, MaxString}} {
		if err := Check([]byte(`{"a":["` + strings.Repeat(c.char, c.n) + `"]}`)); err != nil {
			t.Errorf("%d of %s: %v", c.n, c.char, err)
		}
		if err := Check([]byte(`{"a":["` + strings.Repeat(c.char, c.n+1) + `"]}`)); !errors.As(err, &tooLong) {
			t.Errorf("%d of %s: %v; want too long", c.n+1, c.char, err)
		}
	}
	// A pair that ends one character past the limit.
	if err := Check([]byte(`{"a":["` + strings.Repeat("x", MaxString-1) + `\ud83d\ude00"]}`)); !errors.As(err, &tooLong) {
		t.Errorf("%d characters and a surrogate pair: %v; want too long", MaxString-1, err)
	}
	if err := Check([]byte(members(MaxMembers))); err != nil {
		t.Errorf("%d members: %v", MaxMembers, err)
	}
	var wide *MembersError
	if err := Check([]byte(members(MaxMembers + 1))); !errors.As(err, &wide) || wide.Pointer != "/a" || wide.Limit != MaxMembers {
		t.Errorf("%d members: %v; want too many members at /a", MaxMembers+1, err)
	}
}

// TestFoldAgreesWithEqualFold: two names fold alike exactly when
// strings.EqualFold says they are the same, for every pair drawn from a set
// of runes with interesting case foldings.
func TestFoldAgreesWithEqualFold(t *testing.T) {
	t.Parallel()
	runes := []rune("aAkKsSzZ09_-\u212a\u017f\u00df\u1e9e\u03a3\u03c3\u03c2\u0130\u0131iI\u01c4\u01c5\u01c6")
	for _, a := range runes {
		for _, b := range runes {
			x, y := "n"+string(a), "N"+string(b)
			if got, want := fold([]byte(x)) == fold([]byte(y)), strings.EqualFold(x, y); got != want {
				t.Errorf("fold(%q) == fold(%q) is %v; strings.EqualFold says %v", x, y, got, want)
			}
		}
	}
}

// hostileBodies are the most expensive 64 KiB documents we know how to
// build for this check, each with what makes it expensive.
func hostileBodies() map[string][]byte {
	const size = 64 << 10
	fill := func(prefix, unit, suffix string) []byte {
		var b bytes.Buffer
		b.WriteString(prefix)
		for i := 0; b.Len()+len(unit)+len(suffix)+8 < size; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strings.ReplaceAll(unit, "%d", fmt.Sprint(i)))
		}
		b.WriteString(suffix)
		return b.Bytes()
	}
	return map[string][]byte{
		"deep-nesting":   bytes.Repeat([]byte("["), size),
		"deep-objects":   bytes.Repeat([]byte(`{"a":`), size/5),
		"many-members":   fill("{", `"m%d":0`, "}"),
		"many-upper":     fill("{", `"Member%d":0`, "}"),
		"escaped-names":  fill("{", `"\u0041\u0042%d":0`, "}"),
		"many-objects":   fill("[", `{"a":0,"b":1}`, "]"),
		"long-string":    []byte(`{"a":"` + strings.Repeat("x", size-10) + `"}`),
		"many-escapes":   []byte(`{"a":"` + strings.Repeat(`\u0041`, (size-10)/6) + `"}`),
		"long-name":      []byte(`{"` + strings.Repeat(`\u00e9`, (size-10)/6) + `":1}`),
		"many-numbers":   fill("[", `1234567890`, "]"),
		"wide-then-deep": append(fill("[", `[]`, ""), []byte(","+strings.Repeat("[", 40))...),
	}
}

// TestCheckIsLinear: on every hostile body the check allocates no more
// than a small multiple of the body's size. (The check it replaced built
// a pointer string per level and kept them all: a 64 KiB body of '['
// allocated 4 GiB.)
func TestCheckIsLinear(t *testing.T) {
	for name, body := range hostileBodies() {
		if allocated := bytesAllocated(func() { _ = Check(body) }); allocated > 4*len(body)+64<<10 {
			t.Errorf("%s (%d bytes): allocated %d bytes; want at most 4× the body + 64 KiB", name, len(body), allocated)
		}
	}
}

// BenchmarkHostileBodies measures the check on each hostile body (see
// docs/performance.md): time and allocation per body.
func BenchmarkHostileBodies(b *testing.B) {
	for name, body := range hostileBodies() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				_ = Check(body)
			}
		})
	}
}

func bytesAllocated(f func()) int {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return int(after.TotalAlloc - before.TotalAlloc)
}

// FuzzCheck: on any input the check ends, does not panic, and allocates
// no more than a small multiple of the input.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"a":[{"b":1}]}`, `[]`, `"x"`, `{"\u004b":1,"k":2}`, strings.Repeat("[", 40)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if allocated := bytesAllocated(func() { _ = Check(doc) }); allocated > 4*len(doc)+64<<10 {
			t.Fatalf("allocated %d bytes for a %d-byte document", allocated, len(doc))
		}
	})
}

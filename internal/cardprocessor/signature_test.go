package cardprocessor_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
)

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	secret := []byte("whsec_test")
	body := []byte(`{"id":"evt_1","type":"charge.succeeded"}`)
	now := time.Unix(1_700_000_000, 0)
	header := cardprocessor.Sign(secret, now, body)
	if !strings.HasPrefix(header, "t=1700000000,v1=") || len(header) != len("t=1700000000,v1=")+64 {
		t.Fatalf("header %q", header)
	}
	if err := cardprocessor.Verify(secret, header, body, now.Add(time.Minute), time.Minute*5); err != nil {
		t.Fatalf("a genuine signature: %v", err)
	}
	// Secret rotation: any matching v1 is enough, unknown schemes are
	// ignored, and spaces after commas are tolerated.
	other := cardprocessor.Sign([]byte("whsec_old"), now, body)
	rotated := other + ", " + header[strings.Index(header, ",")+1:] + ",v0=whatever"
	if err := cardprocessor.Verify(secret, rotated, body, now, 0); err != nil {
		t.Fatalf("rotation header %q: %v", rotated, err)
	}

	sig := header[strings.Index(header, "v1=")+3:]
	for name, c := range map[string]struct {
		secret []byte
		header string
		body   []byte
		now    time.Time
		want   error
	}{
		"tampered body":       {secret, header, []byte(`{"id":"evt_1","type":"charge.failed"}`), now, cardprocessor.ErrSignatureMismatch},
		"wrong secret":        {[]byte("whsec_other"), header, body, now, cardprocessor.ErrSignatureMismatch},
		"timestamp swapped":   {secret, "t=1700000001,v1=" + sig, body, now, cardprocessor.ErrSignatureMismatch},
		"flipped signature":   {secret, header[:len(header)-1] + flip(header[len(header)-1]), body, now, cardprocessor.ErrSignatureMismatch},
		"stale":               {secret, header, body, now.Add(5*time.Minute + time.Second), cardprocessor.ErrSignatureStale},
		"from the future":     {secret, header, body, now.Add(-6 * time.Minute), cardprocessor.ErrSignatureStale},
		"empty header":        {secret, "", body, now, cardprocessor.ErrSignatureMalformed},
		"no timestamp":        {secret, "v1=" + sig, body, now, cardprocessor.ErrSignatureMalformed},
		"no signature":        {secret, "t=1700000000", body, now, cardprocessor.ErrSignatureMalformed},
		"two timestamps":      {secret, "t=1700000000,t=1700000000,v1=" + sig, body, now, cardprocessor.ErrSignatureMalformed},
		"signed timestamp":    {secret, "t=+1700000000,v1=" + sig, body, now, cardprocessor.ErrSignatureMalformed},
		"not hex":             {secret, "t=1700000000,v1=zz" + sig[2:], body, now, cardprocessor.ErrSignatureMalformed},
		"short signature":     {secret, "t=1700000000,v1=" + sig[:62], body, now, cardprocessor.ErrSignatureMalformed},
		"no equals":           {secret, "t=1700000000,v1", body, now, cardprocessor.ErrSignatureMalformed},
		"huge header":         {secret, header + strings.Repeat(",x=y", 400), body, now, cardprocessor.ErrSignatureMalformed},
		"empty secret":        {nil, cardprocessor.Sign(nil, now, body), body, now, cardprocessor.ErrSignatureNoSecret},
		"unknown scheme only": {secret, "t=1700000000,v2=" + sig, body, now, cardprocessor.ErrSignatureMalformed},
	} {
		if err := cardprocessor.Verify(c.secret, c.header, c.body, c.now, 5*time.Minute); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", name, err, c.want)
		}
	}
}

func flip(c byte) string {
	if c == '0' {
		return "1"
	}
	return "0"
}

func FuzzVerify(f *testing.F) {
	secret := []byte("whsec_fuzz")
	now := time.Unix(1_700_000_000, 0)
	f.Add(cardprocessor.Sign(secret, now, []byte("{}")), []byte("{}"))
	f.Add("t=1,v1=00", []byte(""))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		// Never panics; accepts only what Sign produced for this body.
		if cardprocessor.Verify(secret, header, body, now, time.Hour) == nil {
			if err := cardprocessor.Verify([]byte("whsec_other"), header, body, now, time.Hour); err == nil {
				t.Fatalf("header %q verifies under two secrets", header)
			}
		}
	})
}

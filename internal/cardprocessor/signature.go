package cardprocessor

// Webhook deliveries are signed with the processor's scheme, and we use it
// in both directions: the processor signs the events it sends us
// (Processor-Signature), and the outbox relay signs the events we send to
// our callers (Payments-Signature), which the demo receiver verifies.
//
//	<Header>: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
//
// The timestamp is inside the signed string, so an attacker who captured a
// delivery cannot re-send it later with a fresh timestamp: Verify rejects
// the old one as stale and a new one as forged.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SignatureTolerance is how far a signature's timestamp may be from the
// receiver's clock; Verify uses it when given a tolerance <= 0.
const SignatureTolerance = 5 * time.Minute

// Errors from Verify; a receiver answers each of them with a 4xx before
// doing any other work.
var (
	ErrSignatureMalformed = errors.New("cardprocessor: signature: malformed header")
	ErrSignatureMismatch  = errors.New("cardprocessor: signature: no matching v1 signature")
	ErrSignatureStale     = errors.New("cardprocessor: signature: timestamp outside the tolerance")
	ErrSignatureNoSecret  = errors.New("cardprocessor: signature: empty secret")
)

// Sign returns the signature header value for body sent at t: a v1
// signature by secret, and one by each of more (an old secret, while it is
// being rotated out).
func Sign(secret []byte, t time.Time, body []byte, more ...[]byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	header := "t=" + ts
	for _, secret := range append([][]byte{secret}, more...) {
		header += ",v1=" + hex.EncodeToString(mac(secret, ts, body))
	}
	return header
}

func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts + "."))
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks a Processor-Signature header against the raw body (the
// exact bytes received: re-encoded JSON would not match). It accepts the
// header if any v1 signature matches, so a sender rotating its secret can
// sign with both, and ignores unknown schemes for the same reason. It
// rejects a timestamp further than tolerance from now in either direction.
//
// The comparison is constant-time (hmac.Equal), so response timing does not
// reveal how many leading bytes of a forged signature were right.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	// An empty secret is a misconfiguration: anyone can compute an HMAC
	// with an empty key, so accepting it would accept forgeries.
	if len(secret) == 0 {
		return ErrSignatureNoSecret
	}
	if tolerance <= 0 {
		tolerance = SignatureTolerance
	}
	if len(header) > 1024 { // bounds the work a hostile header can cause
		return ErrSignatureMalformed
	}
	var (
		ts   string // "" until t= is read
		unix int64
		sigs [][]byte
	)
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrSignatureMalformed
		}
		switch k {
		case "t":
			// Two timestamps would make it ambiguous which one was signed.
			// Digits only: ParseInt alone would accept a sign.
			n, err := strconv.ParseInt(v, 10, 64)
			if ts != "" || err != nil || len(v) > 19 || strings.Trim(v, "0123456789") != "" {
				return ErrSignatureMalformed
			}
			ts, unix = v, n
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return ErrSignatureMalformed
			}
			sigs = append(sigs, sig)
		}
	}
	if ts == "" || len(sigs) == 0 {
		return ErrSignatureMalformed
	}
	// The MAC is over the timestamp exactly as it appears in the header.
	want := mac(secret, ts, body)
	if !slices.ContainsFunc(sigs, func(sig []byte) bool { return hmac.Equal(sig, want) }) {
		return ErrSignatureMismatch
	}
	// Checked after the MAC, so "stale" is only ever said of a genuine
	// signature, which makes the error useful when debugging clock skew.
	if d := now.Sub(time.Unix(unix, 0)); d > tolerance || d < -tolerance {
		return ErrSignatureStale
	}
	return nil
}

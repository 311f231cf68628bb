package events

// A caller's webhook endpoint: where the relay pushes its events, their
// signing secret, and the addresses an endpoint may not have.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

// SecretOverlap is how long a rotated-out webhook secret goes on signing
// deliveries beside the new one: time for a receiver to switch.
const SecretOverlap = 24 * time.Hour

// errPrivateAddress refuses an endpoint inside the server's own network.
var errPrivateAddress = errors.New("a webhook endpoint may not be a loopback, link-local, private or otherwise non-public address")

// CheckWebhookURL says whether raw may be a caller's endpoint: an absolute
// https URL (http too when allowPrivate) with no user info, whose host
// resolves only to public addresses unless allowPrivate: the relay posts to
// it from inside our network, where 127.0.0.1, 10.x or 169.254.169.254 would
// make it a way in (server-side request forgery). The relay checks again as
// it connects (publicOnly): a name may resolve elsewhere later.
func CheckWebhookURL(ctx context.Context, raw string, allowPrivate bool) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.User != nil || (u.Scheme != "https" && (u.Scheme != "http" || !allowPrivate)) {
		return fmt.Errorf("webhook URL %q: want https://host/path, with no user info", Redact(raw))
	}
	if allowPrivate {
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil {
		return fmt.Errorf("webhook URL %q: %w", Redact(raw), err)
	}
	for _, a := range addrs {
		if !isPublic(a) {
			return fmt.Errorf("webhook URL %q resolves to %s: %w", Redact(raw), a, errPrivateAddress)
		}
	}
	return nil
}

// Redact is a webhook URL as shown and logged: without its query (a receiver's token).
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparseable URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// isPublic: IPv6 in 2000::/3, nothing the IANA special-purpose registries mark as not
// globally reachable, nor 6to4 or Teredo (which embed an IPv4 address, as NAT64 does).
func isPublic(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsGlobalUnicast() || (a.Is6() && !netip.MustParsePrefix("2000::/3").Contains(a)) {
		return false
	}
	return !slices.ContainsFunc(notGlobal, func(p netip.Prefix) bool { return p.Contains(a) })
}

var notGlobal = func() (ps []netip.Prefix) {
	for _, p := range strings.Fields(`0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 169.254.0.0/16 172.16.0.0/12
		192.0.0.0/24 192.0.2.0/24 192.88.99.0/24 192.168.0.0/16 198.18.0.0/15 198.51.100.0/24 203.0.113.0/24
		240.0.0.0/4 2001::/23 2001:db8::/32 2002::/16 3fff::/20`) {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return ps
}()

// publicOnly is a net.Dialer's Control: it refuses to connect to an address
// that is not public, whatever name led there.
func publicOnly(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !isPublic(ap.Addr()) {
		return fmt.Errorf("connecting to %s: %w", address, errPrivateAddress)
	}
	return nil
}

// SetWebhookURL sets where the caller's events are pushed (nil: nowhere,
// it pulls them) and returns their signing secret. The events that waited
// for an endpoint are due at once.
func SetWebhookURL(ctx context.Context, pool *pgxpool.Pool, callerID string, webhookURL *string) (secret string, err error) {
	defer postgres.Wrap(&err, "events.SetWebhookURL(%s)", callerID)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if secret, err = queries.SetCallerWebhookURL(ctx, tx, dbsqlc.SetCallerWebhookURLParams{ID: callerID, WebhookUrl: webhookURL}); err != nil {
			return err
		}
		return queries.UnparkCallerEvents(ctx, tx, callerID)
	})
	return secret, err
}

// RotateWebhookSecret gives the caller a new webhook secret and returns it;
// deliveries carry a signature by the old one too until the returned time.
func RotateWebhookSecret(ctx context.Context, db dbsqlc.DBTX, callerID string) (secret string, oldUntil time.Time, err error) {
	defer postgres.Wrap(&err, "events.RotateWebhookSecret(%s)", callerID)
	secret = "whsec_" + rand.Text()
	oldUntil, err = queries.RotateCallerWebhookSecret(ctx, db,
		dbsqlc.RotateCallerWebhookSecretParams{ID: callerID, WebhookSecret: secret, OverlapSeconds: SecretOverlap.Seconds()})
	return secret, oldUntil, err
}

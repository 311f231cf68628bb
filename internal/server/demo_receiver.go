package server

import (
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// demoReceiver is the webhook endpoint of the demo callers, standing in for
// a caller's own server. Not part of the API, it does what every receiver
// must: verify the signature, and deduplicate on the event id, since
// delivery is at least once.
func (s *Server) demoReceiver(c echo.Context) error {
	callerID := c.Param("caller")
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, s.cfg.MaxBodyBytes))
	if err != nil {
		return err
	}
	secret, err := auth.WebhookSecret(c.Request().Context(), s.pool, callerID)
	if postgres.IsNotFound(err) {
		// Answered as a bad signature (a secret nobody has), so this
		// unauthenticated endpoint tells no one which caller ids exist.
		secret = rand.Text()
	} else if err != nil {
		return err
	}
	if err := cardprocessor.Verify([]byte(secret), c.Request().Header.Get(events.SignatureHeader), body, time.Now(), cardprocessor.SignatureTolerance); err != nil {
		return problem.New(problem.InvalidSignature, "the %s header does not verify: %v", events.SignatureHeader, err)
	}
	var d events.Delivery
	if err := json.Unmarshal(body, &d); err != nil || d.ID == "" {
		return problem.New(problem.InvalidRequest, "not an event delivery")
	}
	deliveries, err := events.RecordDemoDelivery(c.Request().Context(), s.pool, callerID, d.ID, d.Type)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"received": true, "duplicate": deliveries > 1})
}

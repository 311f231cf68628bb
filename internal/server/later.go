package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/problem"
)

// The operations below are in the contract but not built yet; each answers
// 501 until its issue lands. They run behind the contract middleware, so a
// request to them is still authenticated and validated first.

func notImplemented(what string) error {
	return problem.New(problem.NotImplemented, "%s is part of the contract but not implemented yet", what)
}

// ReceiveProcessorWebhook is not implemented yet.
func (s *Server) ReceiveProcessorWebhook(context.Context, apigen.ReceiveProcessorWebhookRequestObject) (apigen.ReceiveProcessorWebhookResponseObject, error) {
	return nil, notImplemented("the processor webhook")
}

package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/events"
)

// ReceiveProcessorWebhook hands the processor's event, its signature
// verified by the contract, to the inbox, which applies it once.
func (s *Server) ReceiveProcessorWebhook(ctx context.Context, req apigen.ReceiveProcessorWebhookRequestObject) (apigen.ReceiveProcessorWebhookResponseObject, error) {
	ev := req.Body
	duplicate, err := s.inbox.Receive(ctx, events.ProcessorEvent{
		ID: ev.Id, Type: string(ev.Type), DownstreamKey: ev.Data.DownstreamKey, ObjectID: ev.Data.Id,
		Amount: ev.Data.Amount, Currency: ev.Data.Currency, DeclineCode: ev.Data.DeclineCode, FailureCode: ev.Data.FailureCode,
	})
	if err != nil {
		return nil, err
	}
	return apigen.ReceiveProcessorWebhook200JSONResponse{Received: true, Duplicate: duplicate}, nil
}

package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/events"
)

// ReceiveProcessorWebhook hands an event from the processor to the inbox,
// which applies it once however often it is delivered (see
// events.Inbox.Receive). Its signature was verified by the contract
// middleware before anything else.
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

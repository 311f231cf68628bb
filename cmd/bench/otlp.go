package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is what -tracing points the service's exporter at: an
// OTLP/HTTP endpoint in this process that decodes every export, as a
// collector would, counts its spans and keeps nothing. Its CPU is the
// load generator's (client) in the CPU table, not the server's: the
// server's column is what tracing costs the service.
type otlpReceiver struct {
	url            string
	exports, spans atomic.Int64
}

func startOTLPReceiver() (*otlpReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &otlpReceiver{url: "http://" + ln.Addr().String()}
	empty, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
			var export collectortrace.ExportTraceServiceRequest
			if err == nil {
				err = proto.Unmarshal(body, &export)
			}
			if req.URL.Path != "/v1/traces" || err != nil {
				http.Error(w, "bad export", http.StatusBadRequest)
				return
			}
			n := 0
			for _, rs := range export.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					n += len(ss.Spans)
				}
			}
			r.exports.Add(1)
			r.spans.Add(int64(n))
			w.Header().Set("Content-Type", "application/x-protobuf")
			_, _ = w.Write(empty)
		}))
	}()
	return r, nil
}

// report prints what the service exported. The servers are killed at the
// end of the run, so the spans of their last few seconds, still in the
// exporter's batch, are not among them.
func (r *otlpReceiver) report() {
	fmt.Printf("\ntracing: the OTLP receiver got %d spans in %d exports\n", r.spans.Load(), r.exports.Load())
}

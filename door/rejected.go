package door

import (
	"bytes"
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"sync/atomic"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
)

// MetricRejected counts the door's requests that no method saw.
const MetricRejected = "compass_door_rejected_requests_total"

// UnknownProcedure is the procedure label of a rejected request whose path is
// not one of the door's procedures.
const UnknownProcedure = "unknown"

// servedProcedures are every procedure the door serves: the only values of
// the rejected requests' procedure label besides UnknownProcedure.
// TestServedProceduresAreEveryServedMethod holds the list to the services'
// descriptors.
var servedProcedures = []string{
	runnerv1connect.RunnerServiceEnrollProcedure,
	adminv1connect.AdminServiceListRunnersProcedure,
	adminv1connect.AdminServicePingRunnerProcedure,
	"/" + grpchealth.HealthV1ServiceName + "/Check",
	"/" + grpchealth.HealthV1ServiceName + "/Watch",
	"/" + grpcreflect.ReflectV1ServiceName + "/ServerReflectionInfo",
	"/" + grpcreflect.ReflectV1AlphaServiceName + "/ServerReflectionInfo",
}

// answerStatuses are the HTTP statuses kept whole in the code label of a
// refusal that carries no Connect code, because each names what the client
// got wrong: no such procedure (404, the mux or a service's own router), a
// method other than POST (405), a content type or protocol no handler
// speaks (415), a stream over HTTP/1.1 (505). Any other status is labelled by
// its class ("3xx" for the mux's redirects of unclean paths, "4xx", "5xx").
var answerStatuses = map[int]string{
	http.StatusNotFound:                "404",
	http.StatusMethodNotAllowed:        "405",
	http.StatusUnsupportedMediaType:    "415",
	http.StatusHTTPVersionNotSupported: "505",
}

// maxErrorPeek bounds what is kept of a Connect error body to read its code:
// connect writes the code first, and the rest (the message) is not needed.
const maxErrorPeek = 512

// rejectedMetrics counts, as an HTTP middleware around the door's mux, every
// request that reaches the door but no method: what the mux or Connect
// refuses before the interceptors run (an unknown path, a method other than
// POST, a content type no protocol speaks, a malformed envelope, a message
// over MaxRequestBytes, a bad timeout header), which rpcMetrics cannot see.
// Together the two families count every request the door answers.
//
// Attacker model: anyone who reaches the door chooses the path, method,
// headers and body of a request. So no label is taken from the request: the
// procedure is the path only when it is one of servedProcedures, otherwise
// UnknownProcedure; the code is read from the door's own answer (a Connect
// code, or a status in answerStatuses, or a status class). The series are at
// most len(servedProcedures)+1 times the code values (16 Connect codes, "ok",
// four statuses, five classes), whatever a client sends; nothing is logged
// per request, so a flood costs a counter increment each.
type rejectedMetrics struct {
	rejected *prometheus.CounterVec
	known    map[string]bool
}

func newRejectedMetrics(reg prometheus.Registerer) (*rejectedMetrics, error) {
	m := &rejectedMetrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRejected,
			Help: "Requests the door refused before any method ran, by procedure (the door's own, or unknown for any other path) and code (the Connect code of the answer, or the HTTP status 404, 405, 415, 505, or the status class).",
		}, []string{"procedure", "code"}),
		known: make(map[string]bool, len(servedProcedures)),
	}
	for _, p := range servedProcedures {
		m.known[p] = true
	}
	// The family is in /metrics, and a rate defined, before the first
	// refusal: an unknown path is the refusal a misconfigured client makes.
	m.rejected.WithLabelValues(UnknownProcedure, answerStatuses[http.StatusNotFound])
	if err := reg.Register(m.rejected); err != nil {
		return nil, err
	}
	return m, nil
}

// seenKey is the request context's key of the flag the call interceptor sets
// when a method is called.
type seenKey struct{}

// markSeen records that the call interceptor saw the request of ctx (and
// counts it in compass_door_requests_total).
func markSeen(ctx context.Context) {
	if seen, ok := ctx.Value(seenKey{}).(*atomic.Bool); ok {
		seen.Store(true)
	}
}

// wrap returns next counting what it answers without calling a method.
func (m *rejectedMetrics) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen := new(atomic.Bool)
		rw := &answerWriter{ResponseWriter: w, seen: seen}
		next.ServeHTTP(rw, r.WithContext(context.WithValue(r.Context(), seenKey{}, seen)))
		if seen.Load() {
			return
		}
		procedure := UnknownProcedure
		if m.known[r.URL.Path] {
			procedure = r.URL.Path
		}
		m.rejected.WithLabelValues(procedure, answerCode(rw.status, w.Header(), rw.peek)).Inc()
	})
}

// answerWriter notes the status of the answer and, for a request no method
// saw, the start of a Connect error body, whose code is the answer's.
type answerWriter struct {
	http.ResponseWriter
	seen   *atomic.Bool
	status int
	peek   []byte
	peekOn bool
}

func (w *answerWriter) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
		w.peekOn = status >= 400 && !w.seen.Load() && isJSON(w.Header().Get("Content-Type"))
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *answerWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.peekOn && len(w.peek) < maxErrorPeek {
		w.peek = append(w.peek, p[:min(len(p), maxErrorPeek-len(w.peek))]...)
	}
	return w.ResponseWriter.Write(p)
}

// Flush is passed on: Connect's streams require an http.Flusher.
func (w *answerWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// answerCode is the code label of an answer: the Connect code it carries
// (grpc-status, in the trailers of gRPC or the headers of a gRPC-Web
// trailers-only answer; the code of a Connect error body), or else its HTTP
// status if answerStatuses names it, or else its status class. A gRPC-Web
// answer with its trailers in the body, or a Connect stream's end message,
// is labelled by its status class (2xx): neither comes before a method runs
// but for a bad timeout header on a stream.
func answerCode(status int, header http.Header, peek []byte) string {
	if status == 0 {
		status = http.StatusOK // nothing written: net/http answers 200
	}
	for _, key := range []string{http.TrailerPrefix + "Grpc-Status", "Grpc-Status"} {
		if v := header[key]; len(v) > 0 {
			return grpcStatusCode(v[0])
		}
	}
	if len(peek) > 0 {
		if code, ok := connectErrorCode(peek); ok {
			return code
		}
	}
	if s, ok := answerStatuses[status]; ok {
		return s
	}
	if status < 100 || status > 599 {
		return "5xx" // net/http refuses such a status; never a new label
	}
	return strconv.Itoa(status/100) + "xx"
}

// grpcStatusCode names a grpc-status value as compass_door_requests_total
// names codes; a value that is no code is unknown.
func grpcStatusCode(v string) string {
	n, err := strconv.Atoi(v)
	switch {
	case err != nil || n < 0 || n > int(connect.CodeUnauthenticated):
		return connect.CodeUnknown.String()
	case n == 0:
		return "ok"
	}
	return connect.Code(n).String()
}

// connectErrorCode reads the code of a Connect error body, {"code": "...",
// ...}, from its start: the code must be one of Connect's.
func connectErrorCode(peek []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(peek))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", false
		}
		if key != "code" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return "", false
			}
			continue
		}
		var name string
		if err := dec.Decode(&name); err != nil {
			return "", false
		}
		// UnmarshalText also takes "code_<n>" for any n: only the 16
		// codes are labels.
		var code connect.Code
		if err := code.UnmarshalText([]byte(name)); err != nil || code < connect.CodeCanceled || code > connect.CodeUnauthenticated {
			return "", false
		}
		return code.String(), true
	}
	return "", false
}

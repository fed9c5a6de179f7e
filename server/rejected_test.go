package server_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/compass-runner/identity/door"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
)

const (
	enrollPath      = runnerv1connect.RunnerServiceEnrollProcedure
	listRunnersPath = adminv1connect.AdminServiceListRunnersProcedure
	pingRunnerPath  = adminv1connect.AdminServicePingRunnerProcedure
	healthCheck     = "/grpc.health.v1.Health/Check"
	healthWatch     = "/grpc.health.v1.Health/Watch"
	reflectV1       = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	reflectV1Alpha  = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// doorCounts is a scrape of the door's two request families from /metrics:
// rejected by "procedure code", handled by "/service/method code".
type doorCounts struct{ rejected, handled map[string]float64 }

func scrapeDoor(t *testing.T, metricsAddr string) doorCounts {
	t.Helper()
	code, body := get(t, "http://"+metricsAddr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	c := doorCounts{rejected: map[string]float64{}, handled: map[string]float64{}}
	for _, m := range fams[door.MetricRejected].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		c.rejected[l["procedure"]+" "+l["code"]] = m.GetCounter().GetValue()
	}
	for _, m := range fams[door.MetricRequests].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		c.handled["/"+l["service"]+"/"+l["method"]+" "+l["code"]] = m.GetCounter().GetValue()
	}
	return c
}

// delta is what grew from before to after, by series; a series new in
// after counts from zero.
func delta(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			d[k] = -before[k]
		}
	}
	return d
}

// doorUnderTest is a running Server with its metrics listener, and clients
// that speak HTTP/2 (as Runners do) and HTTP/1.1 to its door over TLS; none
// follows redirects, so a redirect is one request.
type doorUnderTest struct {
	url, metrics string
	h2, h1       *http.Client
}

func startDoor(t *testing.T) doorUnderTest {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile, caFile := servertest.TLS(t, dir)
	si, done, cancel := servertest.Running(t, server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir, MetricsAddr: "127.0.0.1:0",
	})
	t.Cleanup(func() { servertest.Stop(t, done, cancel) })
	doorURL, h2 := servertest.DoorClient(t, si, caFile)
	h2.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	tr := h2.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	tr.ForceAttemptHTTP2 = false
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP1(true)
	h1 := &http.Client{Transport: tr, CheckRedirect: h2.CheckRedirect}
	t.Cleanup(func() { h2.CloseIdleConnections(); h1.CloseIdleConnections() })
	return doorUnderTest{url: doorURL, metrics: si.MetricsAddr, h2: h2, h1: h1}
}

// do sends one request and reads its answer to the end (and the trailers),
// returning the status and the HTTP protocol that carried it.
func (d doorUnderTest) do(t *testing.T, hc *http.Client, method, path string, header http.Header, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, d.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return res.StatusCode, res.Proto
}

// envelope frames msg as gRPC does: a flag byte, its length, itself.
func envelope(msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

func contentType(ct string, more ...string) http.Header {
	h := http.Header{"Content-Type": {ct}}
	for i := 0; i+1 < len(more); i += 2 {
		h.Set(more[i], more[i+1])
	}
	return h
}

// Each way the mux or Connect refuses a request before any method runs is
// counted once, in exactly one series of compass_door_rejected_requests_total:
// the door's procedure when the path is one (else "unknown"), and the code
// the answer carries (a Connect code, whether in gRPC trailers, gRPC-Web
// headers or a Connect error body; else the HTTP status that names the
// refusal, or its class). None of them is counted as a handled call.
func TestEachRefusalBeforeAMethodIsCountedInOneSeries(t *testing.T) {
	d := startDoor(t)
	overLimit := bytes.Repeat([]byte{0x0a}, door.MaxRequestBytes+1)
	cases := []struct {
		name          string
		h1            bool
		method, path  string
		header        http.Header
		body          []byte
		wantStatus    int
		wantProcedure string
		wantCode      string
	}{
		{name: "a path that is no procedure", method: "POST", path: "/enroll",
			header: contentType("application/grpc"), wantStatus: 404, wantProcedure: "unknown", wantCode: "404"},
		{name: "a method the Runner service lacks", method: "POST", path: "/compass.runner.v1.RunnerService/Unenroll",
			header: contentType("application/grpc"), wantStatus: 404, wantProcedure: "unknown", wantCode: "404"},
		{name: "a service's path without its slash, redirected", method: "POST", path: "/compass.runner.v1.RunnerService",
			header: contentType("application/grpc"), wantStatus: 307, wantProcedure: "unknown", wantCode: "3xx"},
		{name: "GET on Enroll", method: "GET", path: enrollPath,
			wantStatus: 405, wantProcedure: enrollPath, wantCode: "405"},
		{name: "DELETE on ListRunners", method: "DELETE", path: listRunnersPath,
			wantStatus: 405, wantProcedure: listRunnersPath, wantCode: "405"},
		{name: "a content type no protocol speaks", method: "POST", path: enrollPath,
			header: contentType("text/plain"), body: []byte("hello"), wantStatus: 415, wantProcedure: enrollPath, wantCode: "415"},
		{name: "no content type", method: "POST", path: pingRunnerPath,
			wantStatus: 415, wantProcedure: pingRunnerPath, wantCode: "415"},
		{name: "a reflection stream over HTTP/1.1", h1: true, method: "POST", path: reflectV1,
			header: contentType("application/grpc"), body: envelope(nil), wantStatus: 505, wantProcedure: reflectV1, wantCode: "505"},
		{name: "a gRPC envelope cut short", method: "POST", path: enrollPath,
			header: contentType("application/grpc"), body: []byte{0, 0, 0}, wantStatus: 200, wantProcedure: enrollPath, wantCode: "internal"},
		{name: "a gRPC message over MaxRequestBytes", method: "POST", path: enrollPath,
			header: contentType("application/grpc"), body: envelope(overLimit), wantStatus: 200, wantProcedure: enrollPath, wantCode: "resource_exhausted"},
		{name: "a gRPC message that is no protobuf", method: "POST", path: listRunnersPath,
			header: contentType("application/grpc"), body: envelope([]byte{0xff, 0xff, 0xff}), wantStatus: 200, wantProcedure: listRunnersPath, wantCode: "invalid_argument"},
		{name: "a gRPC timeout that does not parse", method: "POST", path: pingRunnerPath,
			header: contentType("application/grpc", "Grpc-Timeout", "soon"), body: envelope(nil), wantStatus: 200, wantProcedure: pingRunnerPath, wantCode: "invalid_argument"},
		{name: "a gRPC compression the door lacks", method: "POST", path: enrollPath,
			header: contentType("application/grpc", "Grpc-Encoding", "snappy"), body: envelope(nil), wantStatus: 200, wantProcedure: enrollPath, wantCode: "unimplemented"},
		{name: "a gRPC-Web envelope cut short", method: "POST", path: enrollPath,
			header: contentType("application/grpc-web+proto"), body: []byte{0, 0}, wantStatus: 200, wantProcedure: enrollPath, wantCode: "internal"},
		{name: "a Connect message over MaxRequestBytes", method: "POST", path: enrollPath,
			header: contentType("application/proto"), body: overLimit, wantStatus: 429, wantProcedure: enrollPath, wantCode: "resource_exhausted"},
		{name: "a Connect body that is no protobuf", method: "POST", path: listRunnersPath,
			header: contentType("application/proto"), body: []byte{0xff, 0xff, 0xff}, wantStatus: 400, wantProcedure: listRunnersPath, wantCode: "invalid_argument"},
		{name: "a Connect JSON body that is no JSON", h1: true, method: "POST", path: enrollPath,
			header: contentType("application/json"), body: []byte("{"), wantStatus: 400, wantProcedure: enrollPath, wantCode: "invalid_argument"},
		{name: "a Connect timeout that does not parse", method: "POST", path: enrollPath,
			header: contentType("application/json", "Connect-Timeout-Ms", "-1"), body: []byte("{}"), wantStatus: 400, wantProcedure: enrollPath, wantCode: "invalid_argument"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hc, wantProto := d.h2, "HTTP/2.0"
			if c.h1 {
				hc, wantProto = d.h1, "HTTP/1.1"
			}
			before := scrapeDoor(t, d.metrics)
			status, proto := d.do(t, hc, c.method, c.path, c.header, c.body)
			if status != c.wantStatus || proto != wantProto {
				t.Errorf("answer %d over %s, want %d over %s", status, proto, c.wantStatus, wantProto)
			}
			after := scrapeDoor(t, d.metrics)
			want := map[string]float64{c.wantProcedure + " " + c.wantCode: 1}
			if got := delta(before.rejected, after.rejected); !maps.Equal(got, want) {
				t.Errorf("rejected series grew by %v, want %v", got, want)
			}
			if got := delta(before.handled, after.handled); len(got) != 0 {
				t.Errorf("handled calls grew by %v, want none: no method ran", got)
			}
		})
	}
}

// A call that reaches a method is counted as handled
// (compass_door_requests_total) and never also as rejected, in each of the
// three protocols and for every procedure the door serves: the unary RPCs
// (refused by the bearer authentication, which runs inside the call metrics),
// the health check, and the health and reflection streams.
func TestCallsThatReachAMethodAreNotCountedAsRejected(t *testing.T) {
	d := startDoor(t)
	protocols := map[string][]connect.ClientOption{
		"connect": nil, "grpc": {connect.WithGRPC()}, "grpc-web": {connect.WithGRPCWeb()},
	}
	for name, opts := range protocols {
		runner := runnerv1connect.NewRunnerServiceClient(d.h2, d.url, opts...)
		admin := adminv1connect.NewAdminServiceClient(d.h2, d.url, opts...)
		health := grpchealth.NewClient(d.h2, d.url, opts...)
		calls := []struct {
			procedure, code string
			call            func() error
		}{
			{enrollPath, "unauthenticated", func() error {
				_, err := runner.Enroll(t.Context(), connect.NewRequest(&runnerv1.EnrollRequest{}))
				return err
			}},
			{listRunnersPath, "unauthenticated", func() error {
				_, err := admin.ListRunners(t.Context(), connect.NewRequest(&adminv1.ListRunnersRequest{}))
				return err
			}},
			{pingRunnerPath, "unauthenticated", func() error {
				_, err := admin.PingRunner(t.Context(), connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: "r1"}))
				return err
			}},
			{healthCheck, "ok", func() error {
				_, err := health.Check(t.Context(), &grpchealth.CheckRequest{})
				return err
			}},
		}
		for _, c := range calls {
			t.Run(name+" "+c.procedure, func(t *testing.T) {
				before := scrapeDoor(t, d.metrics)
				err := c.call()
				if got := connect.CodeOf(err); (c.code == "ok") != (err == nil) || (err != nil && got.String() != c.code) {
					t.Fatalf("call: %v, want %s", err, c.code)
				}
				after := scrapeDoor(t, d.metrics)
				if got, want := delta(before.handled, after.handled), map[string]float64{c.procedure + " " + c.code: 1}; !maps.Equal(got, want) {
					t.Errorf("handled calls grew by %v, want %v", got, want)
				}
				if got := delta(before.rejected, after.rejected); len(got) != 0 {
					t.Errorf("rejected series grew by %v, want none", got)
				}
			})
		}
	}

	// The streams, in gRPC over HTTP/2 as grpcurl and kubelet's probes speak
	// it: a Watch (which connect's health service does not implement) and a
	// reflection list of services in v1 and v1alpha, each request stream
	// ended after its one message.
	listServices := envelope([]byte{0x3a, 0x00}) // ServerReflectionRequest{list_services: ""}
	streams := []struct {
		procedure, code string
		msg             []byte
	}{
		{healthWatch, "unimplemented", envelope(nil)},
		{reflectV1, "ok", listServices},
		{reflectV1Alpha, "ok", listServices},
	}
	for _, s := range streams {
		t.Run("grpc "+s.procedure, func(t *testing.T) {
			before := scrapeDoor(t, d.metrics)
			if status, _ := d.do(t, d.h2, "POST", s.procedure, contentType("application/grpc"), s.msg); status != http.StatusOK {
				t.Fatalf("answer %d, want 200", status)
			}
			after := scrapeDoor(t, d.metrics)
			if got, want := delta(before.handled, after.handled), map[string]float64{s.procedure + " " + s.code: 1}; !maps.Equal(got, want) {
				t.Errorf("handled calls grew by %v, want %v", got, want)
			}
			if got := delta(before.rejected, after.rejected); len(got) != 0 {
				t.Errorf("rejected series grew by %v, want none", got)
			}
		})
	}
}

// randomPath is a path no procedure has: random bytes, escaped, in one to
// three segments, alone or after a served service's or procedure's path.
func randomPath(r *rand.Rand) string {
	prefixes := []string{"", "/compass.runner.v1.RunnerService", "/compass.admin.v1.AdminService",
		"/grpc.health.v1.Health", "/grpc.reflection.v1.ServerReflection", enrollPath, healthCheck}
	var b strings.Builder
	b.WriteString(prefixes[r.IntN(len(prefixes))])
	for range 1 + r.IntN(3) {
		seg := make([]byte, 1+r.IntN(40))
		for i := range seg {
			seg[i] = byte(r.IntN(256))
		}
		b.WriteString("/" + url.PathEscape(string(seg)))
	}
	return b.String()
}

// randomToken is a random HTTP token (a method, or a content type's parts).
func randomToken(r *rand.Rand, n int) string {
	const chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+."
	b := make([]byte, n)
	for i := range b {
		b[i] = chars[r.IntN(len(chars))]
	}
	return string(b)
}

// An attacker chooses the path, method and content type of every request:
// a flood of random ones, each counted, adds no series to
// compass_door_rejected_requests_total beyond those an unknown path can make,
// and the raw paths never become labels. An unknown path is answered 404 by
// the mux or a service's router, 307 by the mux for an unclean path, and 405
// or 415 by Connect under the reflection services' paths (grpcreflect mounts
// its one procedure's handler on the whole service path).
func TestAFloodOfRandomPathsAddsNoSeries(t *testing.T) {
	d := startDoor(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, seed>>1))

	// The series an unknown path makes, before the flood.
	const underReflection = "/grpc.reflection.v1.ServerReflection/x"
	for _, p := range []struct {
		method, path string
		header       http.Header
		status       int
	}{
		{"POST", "/no-such-path", nil, http.StatusNotFound},
		{"GET", "/a//b", nil, http.StatusTemporaryRedirect},
		{"GET", underReflection, nil, http.StatusMethodNotAllowed},
		{"POST", underReflection, contentType("text/plain"), http.StatusUnsupportedMediaType},
	} {
		if status, _ := d.do(t, d.h2, p.method, p.path, p.header, nil); status != p.status {
			t.Fatalf("%s %s: %d, want %d", p.method, p.path, status, p.status)
		}
	}
	before := scrapeDoor(t, d.metrics)
	wantSeries := map[string]bool{"unknown 404": true, "unknown 3xx": true, "unknown 405": true, "unknown 415": true}
	if len(before.rejected) != len(wantSeries) {
		t.Fatalf("series before the flood: %v, want %v", before.rejected, wantSeries)
	}
	for k := range before.rejected {
		if !wantSeries[k] {
			t.Fatalf("series %q before the flood; want only %v", k, wantSeries)
		}
	}

	const flood = 400
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"}
	for range flood {
		method := methods[r.IntN(len(methods))]
		if r.IntN(3) == 0 {
			method = strings.ToUpper(randomToken(r, 1+r.IntN(12)))
		}
		header := http.Header{}
		if r.IntN(4) != 0 {
			header.Set("Content-Type", randomToken(r, 1+r.IntN(20))+"/"+randomToken(r, 1+r.IntN(20)))
		}
		path := randomPath(r)
		if status, _ := d.do(t, d.h2, method, path, header, []byte(randomToken(r, r.IntN(64)))); status != 404 && status != 307 && status != 405 && status != 415 {
			t.Fatalf("%s %q: %d, want 404, 307, 405 or 415", method, path, status)
		}
	}

	after := scrapeDoor(t, d.metrics)
	var counted float64
	for k, v := range after.rejected {
		if !wantSeries[k] {
			t.Errorf("the flood made series %q", fmt.Sprintf("%.80s", k))
		}
		counted += v - before.rejected[k]
	}
	if counted != flood {
		t.Errorf("the flood counted %v requests, want %d", counted, flood)
	}
	if got := delta(before.handled, after.handled); len(got) != 0 {
		t.Errorf("handled calls grew by %v, want none", got)
	}
}

package door

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
)

// servedProcedures names every method of the door's services (from their
// descriptors, so a method added to a .proto is not labelled unknown when
// refused), and of grpc.health.v1 as reflection describes it.
func TestServedProceduresAreEveryServedMethod(t *testing.T) {
	files, err := openFiles()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range []string{"grpc/health/v1/health.proto",
		runnerv1.File_compass_runner_v1_runner_proto.Path(), adminv1.File_compass_admin_v1_admin_proto.Path()} {
		fd, err := files.FindFileByPath(name)
		if err != nil {
			t.Fatal(err)
		}
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				want = append(want, "/"+string(svc.FullName())+"/"+string(svc.Methods().Get(j).Name()))
			}
		}
	}
	want = append(want, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
	got := slices.Clone(servedProcedures)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("servedProcedures = %v, want %v", got, want)
	}
}

// answerCode reads the Connect code wherever each protocol puts it, and
// otherwise keeps 404, 405, 415 and 505 and classes every other status.
// Whatever a response holds, the labels stay within a fixed set.
func TestAnswerCodeLabels(t *testing.T) {
	connectBody := func(code string) []byte {
		b, _ := json.Marshal(map[string]string{"code": code, "message": "m"})
		return b
	}
	type tc struct {
		name   string
		status int
		header http.Header
		peek   []byte
		want   string
	}
	var cases []tc
	for n := range 17 {
		want := connect.Code(n).String()
		if n == 0 {
			want = "ok"
		}
		v := strconv.Itoa(n)
		cases = append(cases,
			tc{"grpc trailer " + v, 200, http.Header{http.TrailerPrefix + "Grpc-Status": {v}}, nil, want},
			tc{"grpc-web header " + v, 200, http.Header{"Grpc-Status": {v}}, nil, want})
		if n > 0 {
			cases = append(cases, tc{"connect body " + want, 400, nil, connectBody(want), want})
		}
	}
	cases = append(cases,
		tc{"grpc-status past the codes", 200, http.Header{"Grpc-Status": {"17"}}, nil, "unknown"},
		tc{"grpc-status negative", 200, http.Header{"Grpc-Status": {"-1"}}, nil, "unknown"},
		tc{"grpc-status no number", 200, http.Header{"Grpc-Status": {"x"}}, nil, "unknown"},
		tc{"the trailer before the header", 200, http.Header{http.TrailerPrefix + "Grpc-Status": {"8"}, "Grpc-Status": {"3"}}, nil, "resource_exhausted"},
		tc{"connect body code_<n>", 400, nil, connectBody("code_99"), "4xx"},
		tc{"connect body code not first", 429, nil, []byte(`{"message":"m","details":[{"a":1}],"code":"resource_exhausted"}`), "resource_exhausted"},
		tc{"connect body cut before its code", 500, nil, []byte(`{"message":"m`), "5xx"},
		tc{"connect body not an object", 400, nil, []byte(`["code","internal"]`), "4xx"},
		tc{"connect body code not a string", 400, nil, []byte(`{"code":3}`), "4xx"},
		tc{"connect body without a code", 400, nil, []byte(`{"message":"m"}`), "4xx"},
		tc{"nothing written", 0, nil, nil, "2xx"},
		tc{"404", 404, nil, nil, "404"},
		tc{"405", 405, nil, nil, "405"},
		tc{"415", 415, nil, nil, "415"},
		tc{"505", 505, nil, nil, "505"},
		tc{"413", 413, nil, nil, "4xx"},
		tc{"307", 307, nil, nil, "3xx"},
		tc{"status out of range", 999, nil, nil, "5xx"},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := answerCode(c.status, c.header, c.peek); got != c.want {
				t.Errorf("answerCode(%d, %v, %q) = %q, want %q", c.status, c.header, c.peek, got, c.want)
			}
		})
	}

	// Every status, with and without a grpc-status of any value: the code
	// label takes at most 16 codes, ok, four statuses and five classes.
	labels := map[string]bool{}
	for status := range 1000 {
		labels[answerCode(status, nil, nil)] = true
		labels[answerCode(status, http.Header{"Grpc-Status": {strconv.Itoa(status - 500)}}, nil)] = true
	}
	if len(labels) > 16+1+4+5 {
		t.Errorf("%d code labels: %v", len(labels), labels)
	}
}

// A Connect error body is peeked at only up to maxErrorPeek bytes, only
// for an error status with a JSON content type, and only for a request no
// method saw.
func TestAnswerWriterPeeksOnlyAtARefusalsErrorBody(t *testing.T) {
	long := make([]byte, 3*maxErrorPeek)
	for _, c := range []struct {
		name        string
		seen        bool
		contentType string
		status      int
		want        int
	}{
		{"a refusal's JSON error", false, "application/json; charset=utf-8", 400, maxErrorPeek},
		{"a refusal's plain text", false, "text/plain", 400, 0},
		{"a refusal that succeeded", false, "application/json", 200, 0},
		{"a handled call's JSON error", true, "application/json", 400, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			seen := new(atomic.Bool)
			seen.Store(c.seen)
			rec := httptest.NewRecorder()
			w := &answerWriter{ResponseWriter: rec, seen: seen}
			w.Header().Set("Content-Type", c.contentType)
			w.WriteHeader(c.status)
			for i := 0; i < len(long); i += 100 {
				if _, err := w.Write(long[i:min(i+100, len(long))]); err != nil {
					t.Fatal(err)
				}
			}
			if len(w.peek) != c.want || w.status != c.status {
				t.Errorf("peeked %d bytes, status %d; want %d, %d", len(w.peek), w.status, c.want, c.status)
			}
			if rec.Code != c.status || rec.Body.Len() != len(long) {
				t.Errorf("passed on %d with %d bytes, want %d with %d", rec.Code, rec.Body.Len(), c.status, len(long))
			}
		})
	}
}

package podwatch_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/podwatch"
)

// The list reports the pods already marked for deletion; the watch, from
// the list's resourceVersion with bookmarks and a timeout, reports a pod
// marked for deletion once (its later MODIFIED and DELETED events not
// again) and a pod deleted outright; a bookmark advances the
// resourceVersion the next watch starts from. Each request carries the
// token, the label selector and the limits.
func TestRunReportsDeletedAndTerminatingPods(t *testing.T) {
	f := newFakeAPI(t)
	f.setList(listOf("10",
		item("uid-a", "compass-runner-a", node1, "7", false),
		item("uid-b", "compass-runner-b", node2, "8", true)))
	f.watches <- stream(true,
		event("ADDED", pod("uid-c", "compass-runner-c", node1, "11", false)),
		event("MODIFIED", pod("uid-c", "compass-runner-c", node1, "12", true)),
		event("MODIFIED", pod("uid-c", "compass-runner-c", node1, "13", true)),
		event("DELETED", pod("uid-c", "compass-runner-c", node1, "14", true)),
		event("DELETED", pod("uid-a", "compass-runner-a", node1, "15", false)),
		event("MODIFIED", pod("uid-b", "compass-runner-b", node2, "16", true)),
		bookmark("20"))
	f.watches <- stream(false)
	r := start(t, f, nil)

	at := r.clk.Now()
	want := []podwatch.Gone{
		{UID: "uid-b", Name: "compass-runner-b", Node: node2, At: at},
		{UID: "uid-c", Name: "compass-runner-c", Node: node1, At: at},
		{UID: "uid-a", Name: "compass-runner-a", Node: node1, At: at},
	}
	for i, w := range want {
		if got := r.g.next(t); got != w {
			t.Errorf("report %d = %+v, want %+v", i, got, w)
		}
	}
	waitFor(t, "the second watch", func() bool { return f.count("watch") == 2 })
	if ok, _ := r.w.Healthy(); !ok {
		t.Error("Healthy = false with a watch open")
	}
	if err := r.stop(); err != context.Canceled {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if got := r.g.all(); len(got) != len(want) {
		t.Errorf("%d reports, want %d: %+v", len(got), len(want), got)
	}
	if ok, _ := r.w.Healthy(); ok {
		t.Error("Healthy = true after Run returned")
	}
	if n := r.w.Tracked(); n != 1 {
		t.Errorf("%d pods remembered, want 1 (uid-b; uid-a and uid-c forgotten at their DELETED)", n)
	}

	reqs := f.seen()
	wantReqs := []request{
		{kind: "list", query: map[string]string{"limit": "500", "labelSelector": selector}, auth: "Bearer " + token1},
		{kind: "watch", query: map[string]string{"watch": "1", "resourceVersion": "10", "allowWatchBookmarks": "true",
			"timeoutSeconds": "300", "labelSelector": selector}, auth: "Bearer " + token1},
		{kind: "watch", query: map[string]string{"watch": "1", "resourceVersion": "20", "allowWatchBookmarks": "true",
			"timeoutSeconds": "300", "labelSelector": selector}, auth: "Bearer " + token1},
	}
	if !reflect.DeepEqual(reqs, wantReqs) {
		t.Errorf("requests:\n got %+v\nwant %+v", reqs, wantReqs)
	}
	// A stream the API server ends after sending events is no failure.
	if recs := r.records(t, "podwatch: watching pods failed; retrying"); len(recs) != 0 {
		t.Errorf("failures logged: %v", recs)
	}
}

// A list of several pages: each page asks with the previous one's continue
// token, the watch starts from the list's resourceVersion.
func TestRunListsPageByPage(t *testing.T) {
	f := newFakeAPI(t)
	f.setList(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("continue") {
		case "":
			fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"30","continue":"page-2","remainingItemCount":1},"items":[%s]}`,
				item("uid-a", "a", node1, "1", true))
		case "page-2":
			fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"30"},"items":[%s]}`,
				item("uid-b", "b", node2, "2", true))
		default:
			http.Error(w, "bad continue", http.StatusBadRequest)
		}
	})
	f.watches <- stream(false)
	r := start(t, f, nil)
	for _, name := range []string{"a", "b"} {
		if got := r.g.next(t); got.Name != name {
			t.Errorf("reported %+v, want pod %s", got, name)
		}
	}
	waitFor(t, "the watch", func() bool { return f.count("watch") == 1 })
	reqs := f.seen()
	if reqs[1].query["continue"] != "page-2" || reqs[1].query["limit"] != "500" || reqs[2].query["resourceVersion"] != "30" {
		t.Errorf("requests: %+v", reqs)
	}
}

// What the real API server cannot be made to send: each malformed event
// ends the stream with an ERROR naming it, Healthy turns false, and the
// watch is opened again from the last good resourceVersion, which then
// goes on.
func TestRunRefusesMalformedEvents(t *testing.T) {
	long := strings.Repeat("x", 254)
	for _, tc := range []struct{ name, event, err string }{
		{"not JSON", "{\"type\":\"ADDED\",\"object\":{]}\n",
			"watch: malformed: not JSON of the expected shape"},
		{"not an object", "[1,2]\n",
			"watch: malformed: an event that is not a JSON watch event"},
		{"unknown type", event("SYNC", pod("u", "n", node1, "11", false)),
			`watch: malformed: an event of type "SYNC"`},
		{"no object", `{"type":"ADDED"}` + "\n",
			`watch: malformed: a "ADDED" event without an object`},
		{"a Node", event("ADDED", strings.Replace(pod("u", "n", node1, "11", false), `"kind":"Pod"`, `"kind":"Node"`, 1)),
			`watch: malformed: a ADDED event: a "Node", not a v1 Pod`},
		{"no uid", event("DELETED", pod("", "n", node1, "11", false)),
			"watch: malformed: a DELETED event: metadata.uid empty or longer than 128 bytes"},
		{"name too long", event("MODIFIED", pod("u", long, node1, "11", false)),
			"watch: malformed: a MODIFIED event: metadata.name empty or longer than 253 bytes"},
		{"node too long", event("MODIFIED", pod("u", "n", long, "11", false)),
			"watch: malformed: a MODIFIED event: spec.nodeName longer than 253 bytes"},
		{"no resourceVersion", event("ADDED", pod("u", "n", node1, "", false)),
			"watch: malformed: a ADDED event: metadata.resourceVersion empty or longer than 128 bytes"},
		{"deletionTimestamp empty", event("MODIFIED", strings.Replace(pod("u", "n", node1, "11", false), `"uid"`, `"deletionTimestamp":"","uid"`, 1)),
			"watch: malformed: a MODIFIED event: metadata.deletionTimestamp empty"},
		{"deletionTimestamp a number", event("MODIFIED", strings.Replace(pod("u", "n", node1, "11", false), `"uid"`, `"deletionTimestamp":7,"uid"`, 1)),
			`watch: malformed: a "MODIFIED" event whose object is not a Pod nor a Status`},
		{"bookmark without resourceVersion", event("BOOKMARK", `{"kind":"Pod","apiVersion":"v1","metadata":{}}`),
			"watch: malformed: a BOOKMARK event: metadata.resourceVersion empty or longer than 128 bytes"},
		{"an ERROR not a Status", event("ERROR", pod("u", "n", node1, "11", false)),
			`watch: malformed: an ERROR event of a "Pod", not a Status`},
		{"a control character quoted", event("ADDED\\u202e\\u001b[31m", "{}"),
			`watch: malformed: an event of type "ADDED[31m"`},
		{"an ERROR event", statusEvent(500, "InternalError", "etcdserver: leader changed\n\x1b[31m"),
			`watch: an ERROR event: status 500 "InternalError": "etcdserver: leader changed [31m"`},
		{"the stream cut inside an event", `{"type":"ADDED","object":{"kind":"Pod"`,
			"watch: malformed: the answer ends inside a value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.watches <- stream(true, bookmark("11"), tc.event)
			f.watches <- stream(false, event("DELETED", pod("uid-z", "z", node1, "12", false)))
			r := start(t, f, nil)
			if got := r.g.next(t); got.UID != "uid-z" {
				t.Fatalf("reported %+v, want uid-z", got)
			}
			want := map[string]any{"level": "ERROR", "msg": "podwatch: watching pods failed; retrying", "server": f.srv.URL,
				"namespace": namespace, "error": tc.err, "failures": float64(1)}
			recs := r.records(t, "podwatch: watching pods failed; retrying")
			if len(recs) != 1 || !reflect.DeepEqual(recs[0], want) {
				t.Errorf("log:\n got %v\nwant [%v]", recs, want)
			}
			if reqs := f.seen(); len(reqs) != 3 || reqs[2].query["resourceVersion"] != "11" {
				t.Errorf("requests %+v: want a list and two watches, the second from resourceVersion 11 (the bookmark's)", reqs)
			}
		})
	}
}

// An event larger than MaxEventBytes is refused as malformed, and so is a
// list's pod; one just under it is taken.
func TestRunRefusesAnOversizedEvent(t *testing.T) {
	big := func(n int) string {
		p := pod("uid-big", "big", node1, "11", true)
		pad := `,"annotations":{"pad":"` + strings.Repeat("x", n) + `"}`
		p = strings.Replace(p, `"labels"`, strings.TrimPrefix(pad, ",")+`,"labels"`, 1)
		return event("MODIFIED", p)
	}
	under := big(0)
	under = big(podwatch.MaxEventBytes - len(under) - 16)
	over := big(podwatch.MaxEventBytes)
	f := newFakeAPI(t)
	f.watches <- stream(true, over)
	f.watches <- stream(false, under)
	r := start(t, f, nil)
	if got := r.g.next(t); got.UID != "uid-big" {
		t.Fatalf("reported %+v", got)
	}
	recs := r.records(t, "podwatch: watching pods failed; retrying")
	if len(recs) != 1 || recs[0]["error"] != "watch: malformed: a value larger than MaxEventBytes (4194304)" {
		t.Errorf("log: %v", recs)
	}
	if len(under) > podwatch.MaxEventBytes || len(over) <= podwatch.MaxEventBytes {
		t.Fatalf("sizes %d and %d around %d", len(under), len(over), podwatch.MaxEventBytes)
	}

	n, err := podwatch.Stream(strings.NewReader(`{"a":"`+strings.Repeat("x", 100)+`"}`), 64)
	if n != 0 || !podwatch.IsMalformed(err) {
		t.Errorf("a 108-byte value in a stream of 64: %d values, %v", n, err)
	}
}

// A 410 ends the watch (an ERROR event, as kube-apiserver's watch cache
// sends it, or the answer's status): the pods are listed again, and that
// list reports the pods it no longer holds, deleted while the watch was
// down, and not those already reported. No ERROR is logged.
func TestRunRelistsOnExpiredResourceVersion(t *testing.T) {
	for _, how := range []string{"ERROR event", "410 answer"} {
		t.Run(how, func(t *testing.T) {
			f := newFakeAPI(t)
			f.setList(listOf("10",
				item("uid-a", "a", node1, "1", false),
				item("uid-b", "b", node1, "2", false),
				item("uid-c", "c", node2, "3", true)))
			expire := stream(true, event("ADDED", pod("uid-d", "d", node2, "11", false)),
				statusEvent(410, "Expired", "too old resource version: 10 (25)"))
			if how == "410 answer" {
				f.watches <- stream(true, event("ADDED", pod("uid-d", "d", node2, "11", false)))
				expire = status(http.StatusGone, "too old resource version: 11 (25)")
			}
			// The expiry waits until the list has changed: else the relist
			// could meet the old list.
			release := make(chan struct{})
			f.watches <- gated(release, expire)
			f.watches <- stream(false)
			r := start(t, f, nil)
			if got := r.g.next(t); got.UID != "uid-c" {
				t.Fatalf("first report %+v, want uid-c (marked for deletion)", got)
			}
			waitFor(t, "the first watch", func() bool { return f.count("watch") >= 1 })
			// Meanwhile a and c are deleted, d is marked for deletion and e is new.
			f.setList(listOf("30",
				item("uid-b", "b", node1, "2", false),
				item("uid-d", "d", node2, "26", true),
				item("uid-e", "e", node2, "27", false)))
			close(release)
			var got []string
			for range 2 {
				got = append(got, r.g.next(t).UID)
			}
			if want := []string{"uid-d", "uid-a"}; !reflect.DeepEqual(got, want) {
				t.Errorf("after the relist: reported %v, want %v (d marked, a gone; c already reported)", got, want)
			}
			waitFor(t, "the watch after the relist", func() bool {
				reqs := f.seen()
				last := reqs[len(reqs)-1]
				return last.kind == "watch" && last.query["resourceVersion"] == "30"
			})
			if recs := r.records(t, "podwatch: watching pods failed; retrying"); len(recs) != 0 {
				t.Errorf("failures logged: %v", recs)
			}
			if recs := r.records(t, "podwatch: the resourceVersion expired; listing again"); len(recs) != 1 {
				t.Errorf("relists logged: %v", recs)
			}
			if ok, _ := r.w.Healthy(); !ok {
				t.Error("Healthy = false after a relist")
			}
		})
	}
}

// A 410 straight after the list that gave the resourceVersion is a failure
// (waited for), not a loop of lists.
func TestRunBacksOffAnImmediateExpiry(t *testing.T) {
	f := newFakeAPI(t)
	f.watches <- status(http.StatusGone, "too old resource version: 10 (25)")
	f.watches <- stream(false)
	r := start(t, f, nil)
	waitFor(t, "the second watch", func() bool { return f.count("watch") == 2 })
	recs := r.records(t, "podwatch: watching pods failed; retrying")
	if len(recs) != 1 || recs[0]["error"] != `watch: resourceVersion expired (410 Gone): "too old resource version: 10 (25)"` {
		t.Errorf("log: %v", recs)
	}
	if n := f.count("list"); n != 2 {
		t.Errorf("%d lists, want 2", n)
	}
}

// A failing list or watch (5xx, 401, 403, a redirect, the network) is
// retried for ever with a backoff that doubles to its cap, each failure an
// ERROR with the server, the namespace and the cause (the API server's
// message quoted, the token withheld when quoted), Healthy false since the
// first failure; a watch established turns it true and resets the backoff.
func TestRunRetriesFailuresWithBackoff(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer script
		err    string
	}{
		{"503", status(http.StatusServiceUnavailable, "etcdserver: request timed out"),
			`list: status 503 Service Unavailable: "etcdserver: request timed out"`},
		{"500 without a Status", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) },
			"list: status 500 Internal Server Error"},
		{"401", status(http.StatusUnauthorized, "Unauthorized"),
			"list: the API server refused the watcher's token (401 Unauthorized)"},
		{"403", status(http.StatusForbidden, `pods is forbidden: User "system:serviceaccount:compass-system:other" cannot list resource "pods" in API group "" in the namespace "compass-runner"`),
			`list: the watcher may not list pods in namespace compass-runner (403 Forbidden): see the package's RBAC: "pods is forbidden: User \"system:serviceaccount:compass-system:other\" cannot list resource \"pods\" in API group \"\" in the namespace \"compass-runner\""`},
		{"403 quoting the token", status(http.StatusForbidden, "token "+token1+" may not"),
			"list: the watcher may not list pods in namespace compass-runner (403 Forbidden): see the package's RBAC: (withheld: it quotes the watcher's token)"},
		{"307", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "https://elsewhere.invalid/", http.StatusTemporaryRedirect)
		},
			"list: status 307 Temporary Redirect: redirects are not followed"},
		{"not a PodList", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
		}, `list: malformed: the answer is a "NodeList", not a v1 PodList`},
		{"a page larger than asked", func(w http.ResponseWriter, r *http.Request) {
			items := make([]string, 501)
			for i := range items {
				items[i] = item(fmt.Sprint("uid-", i), "p", node1, "1", false)
			}
			listOf("10", items...)(w, r)
		}, "list: malformed: a page of more than 500 pods, the limit asked for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.setList(tc.answer)
			var mu sync.Mutex
			var sleeps []time.Duration
			const fails = 6
			r := start(t, f, func(r *running) {
				r.w.SetSleep(func(ctx context.Context, d time.Duration) error {
					mu.Lock()
					sleeps = append(sleeps, d)
					n := len(sleeps)
					mu.Unlock()
					if n == fails {
						f.setList(listOf("10"))
					}
					r.clk.add(time.Second)
					return podwatch.SleepCtx(ctx, time.Millisecond)
				})
			}, podwatch.WithBackoff(100*time.Millisecond, 800*time.Millisecond))
			f.watches <- stream(false)
			waitFor(t, "the watch", func() bool { ok, _ := r.w.Healthy(); return ok })

			recs := r.records(t, "podwatch: watching pods failed; retrying")
			if len(recs) != fails {
				t.Fatalf("%d failures logged, want %d: %v", len(recs), fails, recs)
			}
			for i, rec := range recs {
				want := map[string]any{"level": "ERROR", "msg": "podwatch: watching pods failed; retrying", "server": f.srv.URL,
					"namespace": namespace, "error": tc.err, "failures": float64(i + 1)}
				if !reflect.DeepEqual(rec, want) {
					t.Errorf("log line %d:\n got %v\nwant %v", i, rec, want)
				}
			}
			// 100 ms doubling to 800 ms, each drawn from its upper half.
			mu.Lock()
			defer mu.Unlock()
			for i, d := range sleeps {
				ceil := min(100*time.Millisecond<<i, 800*time.Millisecond)
				if d < ceil/2 || d > ceil {
					t.Errorf("wait %d = %s, want within [%s, %s]", i+1, d, ceil/2, ceil)
				}
			}
			if strings.Contains(r.logs.String(), token1) {
				t.Error("the log holds the token")
			}
			// Healthy since the watch opened, after six failures of 1 s each
			// on the test's clock.
			if ok, since := r.w.Healthy(); !ok || !since.Equal(newClock().Now().Add(fails*time.Second)) {
				t.Errorf("Healthy = %v since %s", ok, since)
			}
			est := r.records(t, "podwatch: watching pods")
			if len(est) != 1 || est[0]["unhealthy_for"] != float64(fails*time.Second) || est[0]["resource_version"] != "10" {
				t.Errorf("recovery logged as %v", est)
			}
		})
	}
}

// While failing Healthy is false, since the first failure (on the
// Watcher's clock), however many follow; the watch established again, it
// is true, and the recovery's log line says for how long it was not.
func TestHealthyFalseSinceTheFirstFailure(t *testing.T) {
	f := newFakeAPI(t)
	cut := make(chan struct{})
	f.watches <- func(w http.ResponseWriter, r *http.Request) {
		stream(true)(w, r)
		<-cut
		_, _ = w.Write([]byte("garbage\n"))
	}
	for range 3 {
		f.watches <- status(http.StatusServiceUnavailable, "down")
	}
	f.watches <- stream(false)
	hold, release := make(chan struct{}), make(chan struct{})
	var sleeps int
	r := start(t, f, func(r *running) {
		r.w.SetSleep(func(ctx context.Context, d time.Duration) error {
			r.clk.add(time.Second)
			if sleeps++; sleeps == 4 {
				close(hold)
				<-release
			}
			return nil
		})
	})
	waitFor(t, "the watch", func() bool { ok, _ := r.w.Healthy(); return ok })
	if ok, since := r.w.Healthy(); !ok || !since.Equal(newClock().Now()) {
		t.Errorf("Healthy = %v since %s", ok, since)
	}
	r.clk.add(time.Minute)
	failedAt := r.clk.Now()
	close(cut)
	<-hold
	if ok, since := r.w.Healthy(); ok || !since.Equal(failedAt) {
		t.Errorf("after 4 failures: Healthy = %v since %s, want false since %s", ok, since, failedAt)
	}
	close(release)
	waitFor(t, "the watch again", func() bool { ok, _ := r.w.Healthy(); return ok })
	if ok, since := r.w.Healthy(); !ok || !since.Equal(failedAt.Add(4*time.Second)) {
		t.Errorf("after the recovery: Healthy = %v since %s", ok, since)
	}
	recs := r.records(t, "podwatch: watching pods")
	if len(recs) != 2 || recs[1]["unhealthy_for"] != float64(4*time.Second) || recs[1]["resource_version"] != "10" {
		t.Errorf("established logged as %v", recs)
	}
}

// A stream that falls silent (not even a bookmark) for the idle timeout is
// closed, logged, and opened again from its last resourceVersion; a watch
// whose answer does not come within the request timeout likewise.
func TestRunDetectsADeadStream(t *testing.T) {
	f := newFakeAPI(t)
	f.watches <- stream(false, bookmark("11"))
	f.watches <- func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	f.watches <- stream(false, event("DELETED", pod("uid-z", "z", node1, "12", false)))
	r := start(t, f, func(r *running) { r.w.SetTimeouts(300*time.Millisecond, 200*time.Millisecond, time.Minute) })
	if got := r.g.next(t); got.UID != "uid-z" {
		t.Fatalf("reported %+v", got)
	}
	var errs []any
	for _, rec := range r.records(t, "podwatch: watching pods failed; retrying") {
		errs = append(errs, rec["error"])
	}
	want := []any{"watch: nothing, not even a bookmark, for 200ms: watch stream silent",
		"watch: no answer within 300ms: watch stream silent"}
	if !reflect.DeepEqual(errs, want) {
		t.Errorf("errors logged %q, want %q", errs, want)
	}
	reqs := f.seen()
	if len(reqs) != 4 || reqs[2].query["resourceVersion"] != "11" || reqs[3].query["resourceVersion"] != "11" {
		t.Errorf("requests %+v", reqs)
	}
}

// A stream the API server ends at once, having sent nothing, is a failure
// waited for, not a loop.
func TestRunBacksOffAStreamEndedAtOnce(t *testing.T) {
	f := newFakeAPI(t)
	f.watches <- stream(true)
	f.watches <- stream(false)
	r := start(t, f, nil)
	waitFor(t, "the second watch", func() bool { return f.count("watch") == 2 })
	recs := r.records(t, "podwatch: watching pods failed; retrying")
	if len(recs) != 1 || !strings.HasPrefix(recs[0]["error"].(string), "watch: the API server ended the stream after ") ||
		!strings.HasSuffix(recs[0]["error"].(string), ", having sent nothing") {
		t.Errorf("log: %v", recs)
	}
}

// The token file is read again when it changes: a credential the API
// server refuses is replaced in the file, and the next request carries the
// new one.
func TestRunRereadsTheTokenFile(t *testing.T) {
	f := newFakeAPI(t)
	f.setList(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token2 {
			status(http.StatusUnauthorized, "Unauthorized")(w, r)
			return
		}
		listOf("10")(w, r)
	})
	f.watches <- stream(false)
	r := start(t, f, nil)
	r.logs.WaitFor(t, 10*time.Second, "401 Unauthorized", 1)
	// A new file renamed over the old, as the kubelet swaps a projected
	// volume's ..data link.
	tmp := f.tokenFile + ".new"
	if err := os.WriteFile(tmp, []byte(token2), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.tokenFile); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the watch", func() bool { ok, _ := r.w.Healthy(); return ok })
	reqs := f.seen()
	if first, last := reqs[0].auth, reqs[len(reqs)-1].auth; first != "Bearer "+token1 || last != "Bearer "+token2 {
		t.Errorf("first request's token %q, last %q", first, last)
	}
	if strings.Contains(r.logs.String(), token1) || strings.Contains(r.logs.String(), token2) {
		t.Error("the log holds a token")
	}
}

// Past MaxTrackedPods new pods are not remembered, which one ERROR says; a
// pod past it is still reported when marked for deletion.
func TestRunBoundsTheTrackedPods(t *testing.T) {
	f := newFakeAPI(t)
	f.setList(listOf("10", item("uid-a", "a", node1, "1", false), item("uid-b", "b", node1, "2", false),
		item("uid-c", "c", node1, "3", false)))
	f.watches <- stream(false,
		event("MODIFIED", pod("uid-c", "c", node1, "11", true)),
		event("MODIFIED", pod("uid-c", "c", node1, "12", true)),
		event("DELETED", pod("uid-c", "c", node1, "13", true)))
	r := start(t, f, func(r *running) { r.w.SetMaxTracked(2) })
	for i := range 3 {
		if got := r.g.next(t); got.UID != "uid-c" {
			t.Fatalf("report %d: %+v, want uid-c", i, got)
		}
	}
	r.stop()
	if n := r.w.Tracked(); n != 2 {
		t.Errorf("%d pods remembered, want 2", n)
	}
	recs := r.records(t, "podwatch: more pods than MaxTrackedPods; pods past it are not remembered: each is reported when it is deleted or marked for deletion, possibly more than once, but not if deleted while the watch is down")
	if len(recs) != 1 || recs[0]["max"] != float64(2) || recs[0]["level"] != "ERROR" {
		t.Errorf("log: %v", recs)
	}
}

// Run twice at once: the second returns an error at once.
func TestRunTwiceAtOnce(t *testing.T) {
	f := newFakeAPI(t)
	f.watches <- stream(false)
	r := start(t, f, nil)
	waitFor(t, "the watch", func() bool { ok, _ := r.w.Healthy(); return ok })
	if err := r.w.Run(context.Background()); err == nil || err.Error() != "podwatch: Run is already running" {
		t.Errorf("second Run = %v", err)
	}
}

// Run ends when its ctx does, whatever it is doing: waiting on a stream,
// on an answer, on the backoff.
func TestRunEndsWithItsContext(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fakeAPI)
	}{
		{"streaming", func(f *fakeAPI) { f.watches <- stream(false) }},
		{"waiting for an answer", func(f *fakeAPI) {
			f.watches <- func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
		}},
		{"backing off", func(f *fakeAPI) { f.setList(status(http.StatusServiceUnavailable, "down")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			tc.setup(f)
			r := start(t, f, nil, podwatch.WithBackoff(time.Hour, time.Hour))
			waitFor(t, "a request", func() bool { return len(f.seen()) > 0 && (tc.name != "streaming" || f.count("watch") > 0) })
			time.Sleep(20 * time.Millisecond)
			start := time.Now()
			if err := r.stop(); err != context.Canceled {
				t.Errorf("Run = %v", err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("Run returned %s after its ctx ended", took)
			}
		})
	}
}

package podwatch_test

import (
	"strings"
	"testing"

	"github.com/compass-runner/identity/podwatch"
)

// FuzzParseEvent feeds arbitrary watch events to the decoder: it never
// panics; it fails only as malformed, with an error without a control
// character and no longer than a few quoted fields; and what it accepts is
// a known event type with what that type needs (a Pod's uid, name and
// resourceVersion within their bounds, a bookmark's resourceVersion).
func FuzzParseEvent(f *testing.F) {
	f.Add(event("ADDED", pod("uid-a", "compass-runner-a", node1, "11", false)))
	f.Add(event("MODIFIED", pod("uid-a", "compass-runner-a", node1, "12", true)))
	f.Add(event("DELETED", pod("uid-a", "compass-runner-a", node1, "13", true)))
	f.Add(bookmark("14"))
	f.Add(statusEvent(410, "Expired", "too old resource version: 1 (2)"))
	f.Add(event("ADDED\u202e\x1b", "{}"))
	f.Add(`{"type":"ADDED","object":null}`)
	f.Add(`{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"uid":"u","name":"n","resourceVersion":"1","deletionTimestamp":null}}}`)
	f.Add(`[]`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, data string) {
		ev, err := podwatch.ParseEvent([]byte(data))
		if err != nil {
			if !podwatch.IsMalformed(err) {
				t.Fatalf("error %v is not malformed", err)
			}
			msg := err.Error()
			if strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
				t.Fatalf("error holds a control character: %q", msg)
			}
			if len(msg) > 1024 {
				t.Fatalf("error of %d bytes", len(msg))
			}
			return
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED":
			if ev.UID == "" || len(ev.UID) > 128 || ev.Name == "" || len(ev.Name) > 253 || len(ev.Node) > 253 || ev.RV == "" || len(ev.RV) > 128 {
				t.Fatalf("accepted a %s event of %+v", ev.Type, ev)
			}
		case "BOOKMARK":
			if ev.RV == "" || len(ev.RV) > 128 {
				t.Fatalf("accepted a bookmark without a resourceVersion: %+v", ev)
			}
		case "ERROR":
		default:
			t.Fatalf("accepted an event of type %q", ev.Type)
		}
	})
}

// FuzzParsePage feeds arbitrary list answers to the page decoder: it never
// panics, fails only as malformed, and never returns more pods than the
// limit.
func FuzzParsePage(f *testing.F) {
	f.Add(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"c"},"items":[` +
		item("uid-a", "a", node1, "1", false) + "," + item("uid-b", "b", node1, "2", true) + `]}`)
	f.Add(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":null}`)
	f.Add(`{"items":[{}],"kind":"PodList"}`)
	f.Add(`{"kind":"Status","apiVersion":"v1","code":410}`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, data string) {
		rv, _, n, err := podwatch.ParsePage(strings.NewReader(data), 3)
		if err != nil {
			if !podwatch.IsMalformed(err) {
				t.Fatalf("error %v is not malformed", err)
			}
			return
		}
		if rv == "" || n > 3 {
			t.Fatalf("accepted a page at %q of %d pods", rv, n)
		}
	})
}

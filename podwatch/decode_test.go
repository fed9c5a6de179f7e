package podwatch_test

import (
	"io"
	"strings"
	"testing"

	"github.com/compass-runner/identity/podwatch"
)

// A list page is decoded item by item; what is not a PodList of at most
// the limit asked for is malformed, with exactly this error.
func TestParsePage(t *testing.T) {
	a, b := item("uid-a", "a", node1, "1", false), item("uid-b", "b", node1, "2", true)
	for _, tc := range []struct {
		name, body string
		rv, next   string
		pods       int
		err        string
	}{
		{"two pods", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"c"},"items":[` + a + "," + b + `]}`,
			"9", "c", 2, ""},
		{"keys in another order, unknown keys", `{"items":[` + a + `],"extra":{"x":[1,2]},"metadata":{"resourceVersion":"9"},"apiVersion":"v1","kind":"PodList"}`,
			"9", "", 1, ""},
		{"items null", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":null}`, "9", "", 0, ""},
		{"no items", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"}}`, "9", "", 0, ""},
		{"items with kind", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[` + pod("u", "n", node1, "1", false) + `]}`,
			"9", "", 1, ""},
		{"empty", ``, "", "", 0, "malformed: the answer ends inside the list"},
		{"not an object", `[]`, "", "", 0, "malformed: the list is not a JSON object"},
		{"truncated", `{"kind":"PodList","apiVersion":"v1","items":[` + a, "", "", 0, "malformed: the answer ends inside a value"},
		{"not JSON", `{"kind":PodList}`, "", "", 0, "malformed: not JSON of the expected shape"},
		{"a Status", `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","code":500}`, "", "", 0,
			`malformed: the answer is a "Status", not a v1 PodList`},
		{"no resourceVersion", `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}`, "", "", 0,
			"malformed: the list's metadata.resourceVersion empty or longer than 128 bytes"},
		{"items not a list", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":{}}`, "", "", 0,
			"malformed: items is not a list"},
		{"an item without a uid", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[` + a + "," + item("", "n", node1, "1", false) + `]}`,
			"", "", 0, "malformed: item 1: metadata.uid empty or longer than 128 bytes"},
		{"an item of another kind", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[{"kind":"Node","metadata":{}}]}`,
			"", "", 0, `malformed: item 0: a "Node", not a v1 Pod`},
		{"more than the limit", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[` + a + "," + b + "," + a + `]}`,
			"", "", 0, "malformed: a page of more than 2 pods, the limit asked for"},
		{"a value too large", `{"kind":"PodList","apiVersion":"v1","x":"` + strings.Repeat("x", podwatch.MaxEventBytes) + `"}`,
			"", "", 0, "malformed: a value larger than MaxEventBytes (4194304)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rv, next, n, err := podwatch.ParsePage(strings.NewReader(tc.body), 2)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || !podwatch.IsMalformed(err) {
					t.Fatalf("error %v, want malformed %q", err, tc.err)
				}
				return
			}
			if err != nil || rv != tc.rv || next != tc.next || n != tc.pods {
				t.Fatalf("got %q %q %d %v, want %q %q %d", rv, next, n, err, tc.rv, tc.next, tc.pods)
			}
		})
	}
}

// A stream of events is split into values however the bytes arrive: one at
// a time, several in one read, a value over many reads.
func TestStreamFraming(t *testing.T) {
	evs := bookmark("1") + event("ADDED", pod("u", "n", node1, "2", false)) + "  \n" + bookmark("3")
	n, err := podwatch.Stream(io.MultiReader(oneByte{strings.NewReader(evs)}), podwatch.MaxEventBytes)
	if n != 3 || err != io.EOF {
		t.Errorf("%d values, %v; want 3, EOF", n, err)
	}
}

// oneByte reads one byte at a time.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

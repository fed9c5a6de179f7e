package podwatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
)

// The failures Run logs. Each error it logs satisfies errors.Is with at most
// one of these; its message says why and never quotes the token.
var (
	// errMalformed: an answer or an event that is not what the API says
	// (not JSON, not a Pod, a field missing or too long), or larger than
	// MaxEventBytes, or a page of more than ListPageSize pods.
	errMalformed = errors.New("malformed")
	// errExpired: the API server no longer has the resourceVersion asked
	// for (410 Gone, "too old resource version"): list again.
	errExpired = errors.New("resourceVersion expired")
	// errIdle: the watch stream was silent for idleTimeout.
	errIdle = errors.New("watch stream silent")
)

// Lengths of the fields kept: a pod's name and node name are RFC 1123
// subdomains, its UID a UUID. Longer is malformed, which bounds what a
// tracked pod costs.
const (
	maxNameLen = 253
	maxUIDLen  = 128
	maxRVLen   = 128
)

// wireObject is the part of a watch event's object, or of a list's item,
// that is decoded: a Pod's uid, name, resourceVersion, deletionTimestamp
// and spec.nodeName, or a Status's code, reason and message (an ERROR
// event's object). Everything else is skipped by the decoder.
type wireObject struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		UID               string  `json:"uid"`
		Name              string  `json:"name"`
		ResourceVersion   string  `json:"resourceVersion"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type wireEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// pod is what is kept of a Pod.
type pod struct {
	uid, name, node, rv string
	terminating         bool // metadata.deletionTimestamp set
}

// The watch event types (k8s.io/apimachinery/pkg/watch).
const (
	typeAdded    = "ADDED"
	typeModified = "MODIFIED"
	typeDeleted  = "DELETED"
	typeBookmark = "BOOKMARK"
	typeError    = "ERROR"
)

// event is one decoded watch event.
type event struct {
	typ string
	pod pod // ADDED, MODIFIED, DELETED; BOOKMARK: only rv
	// ERROR: the Status.
	code            int
	reason, message string
}

// parseEvent decodes one watch event. Its errors are errMalformed, and
// quote the server's text only sanitized and capped.
func parseEvent(data []byte) (event, error) {
	var we wireEvent
	if err := json.Unmarshal(data, &we); err != nil {
		return event{}, fmt.Errorf("%w: an event that is not a JSON watch event", errMalformed)
	}
	if len(we.Object) == 0 || string(we.Object) == "null" {
		return event{}, fmt.Errorf("%w: a %s event without an object", errMalformed, quote(we.Type))
	}
	var o wireObject
	if err := json.Unmarshal(we.Object, &o); err != nil {
		return event{}, fmt.Errorf("%w: a %s event whose object is not a Pod nor a Status", errMalformed, quote(we.Type))
	}
	ev := event{typ: we.Type}
	switch we.Type {
	case typeAdded, typeModified, typeDeleted:
		p, err := checkPod(&o)
		if err != nil {
			return event{}, fmt.Errorf("%w: a %s event: %w", errMalformed, we.Type, err)
		}
		ev.pod = p
	case typeBookmark:
		if o.Kind != "Pod" || o.APIVersion != "v1" {
			return event{}, fmt.Errorf("%w: a BOOKMARK event of a %s, not a v1 Pod", errMalformed, quote(o.Kind))
		}
		if err := checkRV(o.Metadata.ResourceVersion); err != nil {
			return event{}, fmt.Errorf("%w: a BOOKMARK event: %w", errMalformed, err)
		}
		ev.pod.rv = o.Metadata.ResourceVersion
	case typeError:
		if o.Kind != "Status" {
			return event{}, fmt.Errorf("%w: an ERROR event of a %s, not a Status", errMalformed, quote(o.Kind))
		}
		ev.code, ev.reason, ev.message = o.Code, o.Reason, o.Message
	default:
		return event{}, fmt.Errorf("%w: an event of type %s", errMalformed, quote(we.Type))
	}
	return ev, nil
}

// checkPod checks o is a v1 Pod with a uid, a name and a resourceVersion of
// bounded lengths.
func checkPod(o *wireObject) (pod, error) {
	m := &o.Metadata
	switch {
	case o.Kind != "Pod" || o.APIVersion != "v1":
		return pod{}, fmt.Errorf("a %s, not a v1 Pod", quote(o.Kind))
	case m.UID == "" || len(m.UID) > maxUIDLen:
		return pod{}, fmt.Errorf("metadata.uid empty or longer than %d bytes", maxUIDLen)
	case m.Name == "" || len(m.Name) > maxNameLen:
		return pod{}, fmt.Errorf("metadata.name empty or longer than %d bytes", maxNameLen)
	case len(o.Spec.NodeName) > maxNameLen:
		return pod{}, fmt.Errorf("spec.nodeName longer than %d bytes", maxNameLen)
	case m.DeletionTimestamp != nil && *m.DeletionTimestamp == "":
		return pod{}, errors.New("metadata.deletionTimestamp empty")
	}
	if err := checkRV(m.ResourceVersion); err != nil {
		return pod{}, err
	}
	// Copies: the strings may point into a large decoded buffer (they do
	// not with encoding/json, but a kept pod must not pin one).
	return pod{uid: strings.Clone(m.UID), name: strings.Clone(m.Name), node: strings.Clone(o.Spec.NodeName),
		rv: strings.Clone(m.ResourceVersion), terminating: m.DeletionTimestamp != nil}, nil
}

func checkRV(rv string) error {
	if rv == "" || len(rv) > maxRVLen {
		return fmt.Errorf("metadata.resourceVersion empty or longer than %d bytes", maxRVLen)
	}
	return nil
}

// budgetReader reads from r until n more bytes have been read, then fails
// with errOverBudget: the decoder above it then cannot buffer more than
// that past what it holds.
type budgetReader struct {
	r   io.Reader
	n   int64
	eof bool // r has said io.EOF
}

var errOverBudget = errors.New("over budget")

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, errOverBudget
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// stream decodes a sequence of JSON values (a watch's events) or the parts
// of one (a list's items) from r, each at most max bytes: the budget is
// renewed for each, so memory stays about twice max whatever r sends.
type stream struct {
	br  *budgetReader
	dec *json.Decoder
	max int64
}

func newStream(r io.Reader, max int) *stream {
	br := &budgetReader{r: r, n: int64(max)}
	return &stream{br: br, dec: json.NewDecoder(br), max: int64(max)}
}

// value decodes the next value into v: io.EOF at the end of r before a
// value starts, errMalformed for a value that is not JSON or is larger than
// max; other errors are r's (the connection's).
func (s *stream) value(v any) error {
	s.br.n = s.max
	start := s.dec.InputOffset()
	err := s.dec.Decode(v)
	return s.check(start, err)
}

// token is the next JSON token (a delimiter, a key), on the same terms.
func (s *stream) token() (json.Token, error) {
	s.br.n = s.max
	start := s.dec.InputOffset()
	t, err := s.dec.Token()
	return t, s.check(start, err)
}

func (s *stream) check(start int64, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil && s.dec.InputOffset()-start > s.max, errors.Is(err, errOverBudget):
		return fmt.Errorf("%w: a value larger than MaxEventBytes (%d)", errMalformed, s.max)
	case err == nil, err == io.EOF:
		return err
	case errors.Is(err, io.ErrUnexpectedEOF), s.br.eof:
		// The second: encoding/json reports an end inside a value as a
		// SyntaxError, not always as io.ErrUnexpectedEOF.
		return fmt.Errorf("%w: the answer ends inside a value", errMalformed)
	case errors.As(err, &syn), errors.As(err, &typ):
		// Not wrapped: its text may quote the input.
		return fmt.Errorf("%w: not JSON of the expected shape", errMalformed)
	case strings.HasPrefix(err.Error(), "json: "):
		return fmt.Errorf("%w: not JSON of the expected shape", errMalformed)
	}
	return err
}

// listMeta is a PodList's metadata.
type listMeta struct {
	ResourceVersion string `json:"resourceVersion"`
	Continue        string `json:"continue"`
}

// page is one decoded list page.
type page struct {
	rv, next string
	pods     []pod
}

// parsePage decodes a PodList from r, its items one at a time, at most
// limit of them.
func parsePage(r io.Reader, limit int) (page, error) {
	s := newStream(r, MaxEventBytes)
	var pg page
	var kind, apiVersion string
	var meta listMeta
	if t, err := s.token(); err != nil {
		return page{}, eofMalformed(err)
	} else if t != json.Delim('{') {
		return page{}, fmt.Errorf("%w: the list is not a JSON object", errMalformed)
	}
	for s.dec.More() {
		t, err := s.token()
		if err != nil {
			return page{}, eofMalformed(err)
		}
		key, _ := t.(string)
		switch key {
		case "kind":
			err = s.value(&kind)
		case "apiVersion":
			err = s.value(&apiVersion)
		case "metadata":
			err = s.value(&meta)
		case "items":
			pg.pods, err = parseItems(s, limit)
		default:
			var skip json.RawMessage
			err = s.value(&skip)
		}
		if err != nil {
			return page{}, eofMalformed(err)
		}
	}
	if _, err := s.token(); err != nil { // the closing '}'
		return page{}, eofMalformed(err)
	}
	switch {
	case kind != "PodList" || apiVersion != "v1":
		return page{}, fmt.Errorf("%w: the answer is a %s, not a v1 PodList", errMalformed, quote(kind))
	case len(meta.Continue) > MaxEventBytes/4:
		return page{}, fmt.Errorf("%w: metadata.continue is too long", errMalformed)
	}
	if err := checkRV(meta.ResourceVersion); err != nil {
		return page{}, fmt.Errorf("%w: the list's %w", errMalformed, err)
	}
	pg.rv, pg.next = meta.ResourceVersion, meta.Continue
	return pg, nil
}

// parseItems decodes a list's items, one Pod at a time.
func parseItems(s *stream, limit int) ([]pod, error) {
	t, err := s.token()
	if err != nil {
		return nil, err
	}
	if t == nil { // "items": null
		return nil, nil
	}
	if t != json.Delim('[') {
		return nil, fmt.Errorf("%w: items is not a list", errMalformed)
	}
	var pods []pod
	for s.dec.More() {
		if len(pods) == limit {
			return nil, fmt.Errorf("%w: a page of more than %d pods, the limit asked for", errMalformed, limit)
		}
		var o wireObject
		if err := s.value(&o); err != nil {
			return nil, err
		}
		// kube-apiserver leaves an item's kind and apiVersion empty (the
		// list's say them).
		if o.Kind == "" && o.APIVersion == "" {
			o.Kind, o.APIVersion = "Pod", "v1"
		}
		p, err := checkPod(&o)
		if err != nil {
			return nil, fmt.Errorf("%w: item %d: %w", errMalformed, len(pods), err)
		}
		pods = append(pods, p)
	}
	if _, err := s.token(); err != nil { // the closing ']'
		return nil, err
	}
	return pods, nil
}

// eofMalformed is err, an end of the answer before the list ends being
// malformed.
func eofMalformed(err error) error {
	if err == io.EOF {
		return fmt.Errorf("%w: the answer ends inside the list", errMalformed)
	}
	return err
}

// quote makes text from the API server fit for an error message or a log
// line: quoted, without control or other unprintable characters, at most
// maxQuoted bytes.
func quote(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch {
		case unicode.IsSpace(c):
			c = ' '
		case !unicode.IsPrint(c):
			continue
		}
		if b.Len()+len(string(c)) > maxQuoted {
			b.WriteString("...")
			break
		}
		b.WriteRune(c)
	}
	return fmt.Sprintf("%q", b.String())
}

// quoteWithout is quote, withheld entirely if s could be quoting token (it
// holds the token's last 32 bytes, or the whole token when shorter).
func quoteWithout(s, token string) string {
	tail := token
	if len(tail) > 32 {
		tail = tail[len(tail)-32:]
	}
	if tail != "" && strings.Contains(s, tail) {
		return "(withheld: it quotes the watcher's token)"
	}
	return quote(s)
}

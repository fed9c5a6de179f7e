package podwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// shortStream: a watch the API server ends cleanly sooner than this, having
// sent nothing, is a failure (a proxy that cuts streams, an API server
// shutting down), waited for by the backoff; kube-apiserver ends a healthy
// watch at timeoutSeconds.
const shortStream = time.Second

// Run lists the namespace's pods once (to learn the resourceVersion and
// report every pod already marked for deletion), then watches them from
// that resourceVersion, calling onGone for each DELETED event and for each
// ADDED or MODIFIED event of a pod whose metadata.deletionTimestamp is set,
// once per UID, until ctx ends; then it returns ctx.Err(). onGone is called
// on Run's goroutine, one call at a time: it must not block.
//
// Run never gives up. A failed list or watch (the network, a 5xx, a 401 or
// 403 of the watcher's own credential, a malformed answer or event, a
// stream silent for WatchIdleTimeout) is logged at ERROR with the server and
// the namespace (never the token) and tried again after the backoff: a
// watch from the last resourceVersion seen, or a list when none was. A 410
// (the resourceVersion too old) lists again at once. A list after the first
// also reports the remembered pods it no longer holds (deleted while the
// watch was down, their DELETED event never seen), unless they were.
//
// Run starts no goroutine that outlives it (the timer of a stream's
// silence ends with the stream, and the pooled connections are closed when
// it returns). Calling Run while it runs returns an error at once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("podwatch: Run is already running")
	}
	defer w.running.Store(false)
	defer w.watchCl.CloseIdleConnections()
	defer w.setHealthy(false)

	var (
		rv    string // the resourceVersion to watch from; "" lists first
		fails int    // failures in a row
	)
	fail := func(err error) error {
		fails++
		d := w.backoff(fails)
		w.setHealthy(false)
		w.log.Error("podwatch: watching pods failed; retrying", "server", w.server, "namespace", w.namespace,
			"error", err.Error(), "failures", fails, "retry_in", d)
		return w.sleep(ctx, d)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		fresh := false
		if rv == "" {
			var err error
			if rv, err = w.list(ctx); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err := fail(err); err != nil {
					return err
				}
				continue
			}
			fresh = true
		}
		res := w.watch(ctx, rv)
		rv = res.rv
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if res.lived >= w.backoffMax {
			fails = 0 // the stream was good for a while: this failure, if it is one, starts a new run
		}
		switch {
		case errors.Is(res.err, errExpired) && !(fresh && res.events == 0):
			w.log.Info("podwatch: the resourceVersion expired; listing again", "server", w.server, "namespace", w.namespace,
				"error", res.err.Error())
			rv = ""
			continue
		case errors.Is(res.err, errExpired):
			// Expired straight after the list that returned it: the API
			// server is not keeping up; not at once again.
			rv = ""
		case res.err == nil && res.lived < shortStream && res.events == 0:
			res.err = fmt.Errorf("watch: the API server ended the stream after %s, having sent nothing", res.lived.Round(time.Millisecond))
		case res.err == nil:
			fails = 0
			continue
		}
		if err := fail(res.err); err != nil {
			return err
		}
	}
}

// backoff is the wait after the n-th failure in a row: backoffMin doubled
// n-1 times, at most backoffMax, drawn from its upper half.
func (w *Watcher) backoff(n int) time.Duration {
	d := w.backoffMin
	for i := 1; i < n && d < w.backoffMax; i++ {
		d *= 2
	}
	d = min(d, w.backoffMax)
	return d/2 + rand.N(d/2+1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// list lists the namespace's pods, page by page, tracking each, and
// returns the list's resourceVersion.
func (w *Watcher) list(ctx context.Context) (string, error) {
	w.gen++
	cont := ""
	for {
		pg, err := w.listPage(ctx, cont)
		if err != nil {
			return "", fmt.Errorf("list: %w", err)
		}
		for _, p := range pg.pods {
			w.track(p)
		}
		if pg.next == "" {
			w.listDone()
			return pg.rv, nil
		}
		cont = pg.next
	}
}

func (w *Watcher) listPage(ctx context.Context, cont string) (page, error) {
	q := url.Values{"limit": {strconv.Itoa(ListPageSize)}}
	if cont != "" {
		q.Set("continue", cont)
	}
	resp, bearer, err := w.get(ctx, w.listClient, q)
	if err != nil {
		return page{}, err
	}
	defer resp.Body.Close()
	if err := w.checkStatus(resp, bearer, "list"); err != nil {
		return page{}, err
	}
	return parsePage(resp.Body, ListPageSize)
}

// watchResult is how a watch ended.
type watchResult struct {
	rv     string        // the last resourceVersion seen (the one watched from if none)
	lived  time.Duration // from the response to the end; 0 if there was none
	events int           // events received
	err    error         // nil: the API server ended the stream
}

// watch watches from rv until the stream ends.
func (w *Watcher) watch(ctx context.Context, rv string) (res watchResult) {
	res.rv = rv
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dog := newWatchdog(w.requestTimeout, func() { cancel(errIdle) })
	defer dog.stop()
	q := url.Values{"watch": {"1"}, "resourceVersion": {rv}, "allowWatchBookmarks": {"true"},
		"timeoutSeconds": {strconv.Itoa(int(w.watchTimeout / time.Second))}}
	resp, bearer, err := w.get(ctx, w.watchCl, q)
	if err != nil {
		if errors.Is(context.Cause(ctx), errIdle) {
			res.err = fmt.Errorf("watch: no answer within %s: %w", w.requestTimeout, errIdle)
		} else {
			res.err = fmt.Errorf("watch: %w", err)
		}
		return res
	}
	defer resp.Body.Close()
	if err := w.checkStatus(resp, bearer, "watch"); err != nil {
		res.err = fmt.Errorf("watch: %w", err)
		return res
	}
	opened := time.Now()
	defer func() { res.lived = time.Since(opened) }()
	if changed, was := w.setHealthy(true); changed {
		w.log.Info("podwatch: watching pods", "server", w.server, "namespace", w.namespace, "resource_version", rv,
			"unhealthy_for", w.now().Sub(was))
	}
	dog.kick(w.idleTimeout)
	s := newStream(resp.Body, MaxEventBytes)
	for {
		var raw json.RawMessage
		switch err := s.value(&raw); {
		case err != nil && errors.Is(context.Cause(ctx), errIdle):
			// First: a cancelled body's read may end in io.EOF.
			res.err = fmt.Errorf("watch: nothing, not even a bookmark, for %s: %w", w.idleTimeout, errIdle)
			return res
		case err == io.EOF:
			return res
		case err != nil:
			res.err = fmt.Errorf("watch: %w", err)
			return res
		}
		dog.kick(w.idleTimeout)
		ev, err := parseEvent(raw)
		if err != nil {
			res.err = fmt.Errorf("watch: %w", err)
			return res
		}
		res.events++
		switch ev.typ {
		case typeAdded, typeModified:
			w.track(ev.pod)
		case typeDeleted:
			w.deleted(ev.pod)
		case typeError:
			if ev.code == http.StatusGone {
				res.err = fmt.Errorf("watch: %w: %s", errExpired, quoteWithout(ev.message, bearer))
			} else {
				res.err = fmt.Errorf("watch: an ERROR event: status %d %s: %s", ev.code, quote(ev.reason), quoteWithout(ev.message, bearer))
			}
			return res
		}
		res.rv = ev.pod.rv
	}
}

// get sends a GET of the namespace's pods with q, with the watcher's token;
// it returns the token sent, to keep it out of what is quoted.
func (w *Watcher) get(ctx context.Context, c *http.Client, q url.Values) (*http.Response, string, error) {
	if w.selector != "" {
		q.Set("labelSelector", w.selector)
	}
	bearer, err := w.cred.Token()
	if err != nil {
		return nil, "", fmt.Errorf("the watcher's token file: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.podsURL+"?"+q.Encode(), nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		// A *url.Error: the method, the URL and the cause, none of which
		// holds the token (it is in a header).
		return nil, "", err
	}
	return resp, bearer, nil
}

// checkStatus is nil for a 200, else why not; verb is list or watch.
func (w *Watcher) checkStatus(resp *http.Response, bearer, verb string) error {
	code := resp.StatusCode
	if code == http.StatusOK {
		return nil
	}
	msg := statusMessage(resp.Body, bearer)
	switch {
	case code == http.StatusUnauthorized:
		return errors.New("the API server refused the watcher's token (401 Unauthorized)")
	case code == http.StatusForbidden:
		return fmt.Errorf("the watcher may not %s pods in namespace %s (403 Forbidden): see the package's RBAC%s", verb, w.namespace, msg)
	case code == http.StatusGone:
		return fmt.Errorf("%w (410 Gone)%s", errExpired, msg)
	case code >= 300 && code < 400:
		return fmt.Errorf("status %d %s: redirects are not followed", code, http.StatusText(code))
	}
	// Status text from the table, not the server's reason phrase.
	return fmt.Errorf("status %d %s%s", code, http.StatusText(code), msg)
}

// statusMessage is ": " and the message of the metav1.Status an error
// answer carries, quoted, or "".
func statusMessage(body io.Reader, bearer string) string {
	data, _ := io.ReadAll(io.LimitReader(body, maxErrorBody))
	var st struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &st) != nil || st.Kind != "Status" || st.Message == "" {
		return ""
	}
	return ": " + quoteWithout(st.Message, bearer)
}

// watchdog runs f once, unless kicked, d after it was made or last
// kicked.
type watchdog struct {
	t     *time.Timer
	fired chan struct{} // closed when f has returned
}

func newWatchdog(d time.Duration, f func()) *watchdog {
	wd := &watchdog{fired: make(chan struct{})}
	wd.t = time.AfterFunc(d, func() {
		defer close(wd.fired)
		f()
	})
	return wd
}

// kick re-arms the watchdog for d, unless it has fired.
func (wd *watchdog) kick(d time.Duration) {
	if wd.t.Stop() {
		wd.t.Reset(d)
	}
}

// stop disarms the watchdog, or waits for f if it has fired: nothing of it
// outlives the watch.
func (wd *watchdog) stop() {
	if !wd.t.Stop() {
		<-wd.fired
	}
}

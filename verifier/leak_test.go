package verifier

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// TestMain checks, after the whole suite, that no token the suite presented
// (nor any third of one) appears in any log line or error text it produced.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		presented.mu.Lock()
		leaks := findLeaks(suiteLogs.String()+strings.Join(presented.errs, "\n"), presented.tokens)
		n := len(presented.tokens)
		presented.mu.Unlock()
		if len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: token material in logs or errors: %d occurrences (first at token #%s)\n", len(leaks), leaks[0])
			code = 1
		} else if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "no token material in %d bytes of logs and errors across %d presented tokens\n", len(suiteLogs.String()), n)
		}
	}
	os.Exit(code)
}

// findLeaks returns the indexes (as text, never the material) of tokens of
// which a third appears in text. Tokens too short to be secret are skipped.
func findLeaks(text string, tokens []string) []string {
	var out []string
	for i, tok := range tokens {
		if len(tok) < 24 {
			continue
		}
		third := len(tok) / 3
		for _, part := range []string{tok[:third], tok[third : 2*third], tok[2*third:]} {
			if strings.Contains(text, part) {
				out = append(out, fmt.Sprint(i))
				break
			}
		}
	}
	return out
}

// A focused pass over every failure class, including the logged ones (fetch
// failures, shared keys, ignored keys), with the checker proven to bite.
func TestNoTokenInLogs(t *testing.T) {
	var logs testlog.Buffer
	clk := newClock()
	f := &fault{}
	a := newIssuerWrapped(t, clk, f.wrap)
	b := newIssuer(t, kubeissuer.RS256, clk)
	v, err := New([]RunnerCluster{clusterFor(t, a, "a"), clusterFor(t, b, "b")}, WithClock(clk.Now),
		WithLogger(newTextLogger(&logs)))
	if err != nil {
		t.Fatal(err)
	}
	st := &spyStore{}
	r := NewResolver(v, st)
	var toks, errs []string
	try := func(tok string, want SubjectKind) {
		_, err := r.Resolve(context.Background(), tok, want)
		toks = append(toks, tok)
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	mustRefresh(t, v)
	good := mustToken(t, a, "n")
	try(good, SubjectRunner)
	try(good, SubjectAccount)
	try(good[:len(good)-4]+"AAAA", SubjectRunner)
	expired := a.Claims(kubeissuer.Pod{NodeName: "n"}, 0)
	expired["exp"] = clk.Now().Add(-3 * Leeway).Unix()
	try(mustSign(t, a, expired), SubjectRunner)
	stranger, _ := testkeys.Key(kubeissuer.RS256)
	forged, _ := kubeissuer.SignWith(stranger, a.Claims(kubeissuer.Pod{NodeName: "n"}, 0), nil)
	try(forged, SubjectRunner)
	f.set("huge")
	clk.Advance(KIDMissCooldown)
	try(forged, SubjectRunner)
	b.PublishKey(a.SigningKey(), false)
	f.set("")
	mustRefresh(t, v)
	try(good, SubjectRunner)
	try(st.put(t, SubjectRunner, "h", true), SubjectRunner)
	try(st.put(t, SubjectAccount, "h", false), SubjectRunner)
	clk.Advance(2 * StaleAfter)
	try(good, SubjectRunner)

	text := logs.String() + strings.Join(errs, "\n")
	if !strings.Contains(text, "shared") || !strings.Contains(text, "fetch failed") {
		t.Fatalf("the failure paths did not log (got %d bytes): the check would prove nothing", len(text))
	}
	if leaks := findLeaks(text, toks); len(leaks) > 0 {
		t.Fatalf("token material in logs or errors, tokens #%v", leaks)
	}
	// The checker bites: a log line quoting a third of a token is caught.
	if findLeaks(text+good[len(good)/3:2*len(good)/3], []string{good}) == nil {
		t.Fatal("findLeaks missed a planted third of a token")
	}
}

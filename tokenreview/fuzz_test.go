package tokenreview_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/compass-runner/identity/tokenreview"
)

// FuzzParse feeds arbitrary answers to the parser: it never panics, answers
// with exactly one of the two failures or an accepted Result naming one pod,
// and its error never quotes the token nor carries a control character.
func FuzzParse(f *testing.F) {
	const token = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.eyJzdWIiOiJzIn0.c2lnbmF0dXJlLW9mLXRoZS1mdXp6LXRva2VuLTEyMzQ1Njc4OTA"
	wrap := func(status string) string {
		return `{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","spec":{"token":"` + token + `"},"status":` + status + `}`
	}
	f.Add(wrap(acceptedStatus))
	f.Add(wrap(deletedPodStatus))
	f.Add(wrap(`{"error":"` + token + `"}`))
	f.Add(wrap(`{"error":"\u0000\u001b[31m\u202e"}`))
	f.Add(wrap(`{"authenticated":true,"user":{"username":"` + token + `"},"audiences":["` + token + `"]}`))
	f.Add(wrap(`null`))
	f.Add(`{"kind":"Status","apiVersion":"v1","status":"Failure"}`)
	f.Add(`{}`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, data string) {
		res, err := tokenreview.Parse([]byte(data), audience, runnerUser, token)
		if err == nil {
			if res.PodName == "" || res.PodUID == "" {
				t.Fatalf("accepted without a pod: %+v", res)
			}
			return
		}
		if res != (tokenreview.Result{}) {
			t.Fatalf("a failure with a Result: %+v", res)
		}
		if errors.Is(err, tokenreview.ErrRejected) == errors.Is(err, tokenreview.ErrUnavailable) {
			t.Fatalf("error %v is not exactly one of ErrRejected and ErrUnavailable", err)
		}
		msg := err.Error()
		if strings.Contains(msg, token[len(token)-32:]) {
			t.Fatalf("error quotes the token: %s", msg)
		}
		if strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("error holds a control character: %q", msg)
		}
	})
}

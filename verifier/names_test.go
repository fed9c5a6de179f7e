package verifier

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The rules as regular expressions: the oracle for the hand-written checks.
var (
	nodeNameOracle = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	nodeUIDOracle  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

func nameOracle(s string) bool { return len(s) <= maxNodeName && nodeNameOracle.MatchString(s) }

func TestValidNodeName(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"ip-10-0-1-5.ec2.internal", true},
		{"a", true},
		{"0", true},
		{"a-b", true},
		{"a--b", true},
		{"a.b.c", true},
		{strings.Repeat("a", 253), true},
		{strings.Repeat("a", 254), false},
		{"", false},
		{"-a", false},
		{"a-", false},
		{"a.-b", false},
		{"a-.b", false},
		{".a", false},
		{"a.", false},
		{"a..b", false},
		{"A", false},
		{"a_b", false},
		{"a b", false},
		{"é", false},
		{"a\x00", false},
	} {
		if got := validNodeName(tc.in); got != tc.want || nameOracle(tc.in) != tc.want {
			t.Errorf("validNodeName(%q) = %v, oracle %v, want %v", tc.in, got, nameOracle(tc.in), tc.want)
		}
	}
}

func TestValidNodeUID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"9f0c6f3e-4a1b-4c2d-8e9f-0a1b2c3d4e5f", true},
		{"A", true},
		{"a.b_c-d", true},
		{"a" + strings.Repeat("-", 127), true},
		{"a" + strings.Repeat("-", 128), false},
		{"", false},
		{"-a", false},
		{".a", false},
		{"_a", false},
		{"a b", false},
		{"a/b", false},
		{"é", false},
	} {
		if got := validNodeUID(tc.in); got != tc.want || nodeUIDOracle.MatchString(tc.in) != tc.want {
			t.Errorf("validNodeUID(%q) = %v, oracle %v, want %v", tc.in, got, nodeUIDOracle.MatchString(tc.in), tc.want)
		}
	}
}

// Random strings over the alphabets that matter agree with the oracle.
func TestNameChecksAgreeWithTheOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "az09-._AZ/ "
	for range 200000 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		s := string(b)
		if validNodeName(s) != nameOracle(s) {
			t.Fatalf("validNodeName(%q) = %v, oracle %v", s, validNodeName(s), nameOracle(s))
		}
		if validNodeUID(s) != nodeUIDOracle.MatchString(s) {
			t.Fatalf("validNodeUID(%q) = %v, oracle %v", s, validNodeUID(s), nodeUIDOracle.MatchString(s))
		}
	}
}

// FuzzNameChecks: any input, the hand-written checks and the oracle agree.
func FuzzNameChecks(f *testing.F) {
	for _, s := range []string{"ip-10-0-1-5.ec2.internal", "a..b", "-a", "9f0c6f3e-4a1b", strings.Repeat("a", 253)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if validNodeName(s) != nameOracle(s) {
			t.Fatalf("validNodeName(%q) = %v, oracle %v", s, validNodeName(s), nameOracle(s))
		}
		if validNodeUID(s) != nodeUIDOracle.MatchString(s) {
			t.Fatalf("validNodeUID(%q) = %v, oracle %v", s, validNodeUID(s), nodeUIDOracle.MatchString(s))
		}
	})
}

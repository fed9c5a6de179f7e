package verifier

import (
	"fmt"
	"strings"
	"time"
)

// SubjectKind says what a token authenticates. It is sealed to these two.
type SubjectKind int

const (
	// SubjectAccount is an operator or automation account (minted tokens only).
	SubjectAccount SubjectKind = iota + 1
	// SubjectRunner is a Runner: a minted Runner token or a projected token.
	SubjectRunner
)

func (k SubjectKind) String() string {
	switch k {
	case SubjectAccount:
		return "account"
	case SubjectRunner:
		return "runner"
	default:
		return fmt.Sprintf("SubjectKind(%d)", int(k))
	}
}

// Valid reports whether k is one of the two kinds.
func (k SubjectKind) Valid() bool { return k == SubjectAccount || k == SubjectRunner }

// Subject is who a verified token speaks for.
type Subject struct {
	Kind   SubjectKind
	ID     string // Runner ID or account name
	Tenant string // the bootstrap tenant; Runners are shared across tenants

	// Expiry is the token's exp, or a minted token's expiry (minted with a
	// TTL); zero for a minted token that does not expire.
	Expiry time.Time

	// NotAfter bounds whatever a door grants on this token: nothing derived
	// from it (a NATS user JWT, a session) may last past it. For a projected
	// token it is Expiry plus Leeway, the same instant at which Resolve starts
	// refusing the token. For a minted token it is its expiry, with no
	// leeway (Resolve refuses it from that instant); zero when it does not
	// expire (no bound but the door's own).
	NotAfter time.Time

	// Workload is set for projected tokens and nil for minted ones.
	Workload *Workload

	// TokenID is a minted token's public ID (MintedToken.TokenID); empty for
	// projected tokens.
	TokenID string
}

// Workload is what a verified projected ServiceAccount token says about the pod.
type Workload struct {
	Cluster        string // registered cluster name
	Namespace      string
	ServiceAccount string
	NodeName       string
	NodeUID        string
	PodName        string
	PodUID         string
	JTI            string
	IssuedAt       time.Time
	// KeyID is the kid of the issuer key that signed the token: a door that
	// keeps something alive on the token ends it when the key is pulled
	// (RunnerVerifier.CheckKey).
	KeyID string
}

// Method says how the subject authenticated: "projected" or "minted".
func (s Subject) Method() string {
	if s.Workload != nil {
		return "projected"
	}
	return "minted"
}

// WorkloadRunnerID is the Runner ID of a node in a registered cluster:
// cluster + "/" + node, with every "." in the node name replaced by "_".
//
// RFC 1123 node names contain neither "_" nor "/", and cluster names match
// [a-z0-9-]{1,40}, so the mapping is injective and splits unambiguously at the
// first "/". The result is a single NATS subject token.
func WorkloadRunnerID(cluster, node string) string {
	return cluster + "/" + strings.ReplaceAll(node, ".", "_")
}

// SplitWorkloadRunnerID reverses WorkloadRunnerID. ok is false for IDs without
// a "/" (minted Runner IDs).
func SplitWorkloadRunnerID(id string) (cluster, node string, ok bool) {
	cluster, rest, ok := strings.Cut(id, "/")
	if !ok || cluster == "" || rest == "" {
		return "", "", false
	}
	return cluster, strings.ReplaceAll(rest, "_", "."), true
}

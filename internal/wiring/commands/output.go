package commands

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/store"
)

// The store commands' output: --output table|json, the JSON documents of
// list-tokens and runners (docs/server.md, "Machine-readable output"), and
// the times the tables print.

// The --output words.
const (
	outputTable = "table"
	outputJSON  = "json"
)

func registerOutput(fs *flag.FlagSet, output *string) {
	cli.EnumVar(fs, output, "output", outputTable, "table (aligned columns, for people) or json (one object, for scripts; docs/server.md)", outputTable, outputJSON)
}

// tokenJSON is one token in list-tokens --output json: the table's columns,
// no more. A token and its hash are never listed (the store keeps only the
// hash, and the hash is no business of a script).
type tokenJSON struct {
	ID        string  `json:"id"`
	Kind      string  `json:"kind"`
	Subject   string  `json:"subject"`
	CreatedAt *string `json:"created_at"`
	ExpiresAt *string `json:"expires_at"`
	RevokedAt *string `json:"revoked_at"`
}

// tokensList is list-tokens --output json.
type tokensList struct {
	Tokens []tokenJSON `json:"tokens"`
}

func tokensJSON(infos []store.TokenInfo) tokensList {
	out := tokensList{Tokens: make([]tokenJSON, 0, len(infos))}
	for _, i := range infos {
		out.Tokens = append(out.Tokens, tokenJSON{ID: i.ID, Kind: i.Kind.String(), Subject: i.SubjectID,
			CreatedAt: jsonTime(i.CreatedAt), ExpiresAt: jsonTime(i.ExpiresAt), RevokedAt: jsonTime(i.RevokedAt)})
	}
	return out
}

// jsonTime is a time in RFC 3339, UTC, whole seconds (as the table shows
// it); nil, null in JSON, for the zero time.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339)
	return &s
}

// jsonString is s, or nil (null) when it is empty.
func jsonString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("server: write JSON: %w", err)
	}
	return nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// runnerJSON is one Runner in runners --output json.
type runnerJSON struct {
	ID              string  `json:"id"`
	Method          string  `json:"method"`
	Cluster         *string `json:"cluster"`
	NodeName        *string `json:"node_name"`
	NodeUID         *string `json:"node_uid"`
	PodName         *string `json:"pod_name"`
	PodUID          *string `json:"pod_uid"`
	Version         *string `json:"version"`
	Hostname        *string `json:"hostname"`
	FirstEnrolledAt *string `json:"first_enrolled_at"`
	LastEnrolledAt  *string `json:"last_enrolled_at"`
	LastSeenAt      *string `json:"last_seen_at"`
}

// runnersList is runners --output json.
type runnersList struct {
	Runners []runnerJSON `json:"runners"`
	// Quarantined are the quarantined Runner IDs (DL-459), from the
	// database or the admin door.
	Quarantined []quarantineJSON `json:"quarantined,omitempty"`
}

type quarantineJSON struct {
	RunnerID      string  `json:"runner_id"`
	QuarantinedAt *string `json:"quarantined_at"`
	Displacements int     `json:"displacements"`
	NewerClient   *string `json:"newer_client"`
	OlderClient   *string `json:"older_client"`
}

func runnersJSON(rs []store.Runner, qs []store.Quarantine) runnersList {
	out := runnersList{Runners: make([]runnerJSON, 0, len(rs))}
	for _, q := range qs {
		out.Quarantined = append(out.Quarantined, quarantineJSON{RunnerID: q.RunnerID, QuarantinedAt: jsonTime(q.QuarantinedAt),
			Displacements: q.Displacements, NewerClient: jsonString(q.NewerClient), OlderClient: jsonString(q.OlderClient)})
	}
	for _, r := range rs {
		out.Runners = append(out.Runners, runnerJSON{ID: r.ID, Method: r.Method,
			Cluster: jsonString(r.Cluster), NodeName: jsonString(r.NodeName), NodeUID: jsonString(r.NodeUID),
			PodName: jsonString(r.PodName), PodUID: jsonString(r.PodUID),
			Version: jsonString(r.Version), Hostname: jsonString(r.Hostname),
			FirstEnrolledAt: jsonTime(r.FirstEnrolledAt), LastEnrolledAt: jsonTime(r.LastEnrolledAt), LastSeenAt: jsonTime(r.LastSeenAt)})
	}
	return out
}

func quarantineFromProto(q *adminv1.Quarantine) store.Quarantine {
	var at time.Time
	if q.GetQuarantinedAt() != nil {
		at = q.GetQuarantinedAt().AsTime()
	}
	return store.Quarantine{RunnerID: q.GetRunnerId(), QuarantinedAt: at, Displacements: int(q.GetDisplacements()),
		NewerClient: q.GetNewerClient(), OlderClient: q.GetOlderClient()}
}

func runnerFromProto(r *adminv1.Runner) store.Runner {
	t := func(ts interface{ AsTime() time.Time }, set bool) time.Time {
		if !set {
			return time.Time{}
		}
		return ts.AsTime()
	}
	return store.Runner{ID: r.GetId(), Method: r.GetMethod(), Cluster: r.GetCluster(), NodeName: r.GetNodeName(),
		NodeUID: r.GetNodeUid(), PodName: r.GetPodName(), PodUID: r.GetPodUid(),
		Version: r.GetVersion(), Hostname: r.GetHostname(),
		FirstEnrolledAt: t(r.GetFirstEnrolled(), r.GetFirstEnrolled() != nil),
		LastEnrolledAt:  t(r.GetLastEnrolled(), r.GetLastEnrolled() != nil),
		LastSeenAt:      t(r.GetLastSeen(), r.GetLastSeen() != nil)}
}

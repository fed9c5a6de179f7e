package verifier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// ReadClusterFile reads and parses the cluster file at path (DL-440's
// --runner-clusters). It reads at most one byte past MaxClusterFileBytes, so
// a file over the limit is refused without being read whole. Both daemons
// load the trust root through it.
func ReadClusterFile(path string) ([]RunnerCluster, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("verifier: cluster file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxClusterFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("verifier: cluster file %s: %w", path, err)
	}
	cs, err := ParseRunnerClusters(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return cs, nil
}

// ErrReservedRunnerIDs: clusters are registered while a live minted Runner
// token has an ID containing "/", which DL-440 reserves for Kubernetes Runner
// IDs (<cluster>/<node>). Resolve refuses such a token at every door; a
// daemon refuses to start while one exists, so the operator hears of it at
// once rather than from a Runner that can no longer connect.
var ErrReservedRunnerIDs = errors.New("verifier: minted Runner tokens with \"/\" in their ID exist while runner clusters are registered")

// SlashIDCounter counts the non-revoked minted Runner tokens whose ID
// contains "/". The store implements it.
type SlashIDCounter interface {
	CountRunnerTokenIDsWithSlash(ctx context.Context) (int64, error)
}

// CheckReservedRunnerIDs is the start-up guard both daemons run: with
// clusters registered, no live minted Runner token may have "/" in its ID.
func CheckReservedRunnerIDs(ctx context.Context, st SlashIDCounter, clusters int) error {
	if clusters == 0 || st == nil {
		return nil
	}
	n, err := st.CountRunnerTokenIDsWithSlash(ctx)
	if err != nil {
		return fmt.Errorf("verifier: count minted Runner tokens with \"/\": %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: %d such token(s); revoke them (compass-server list-tokens, then revoke-token ID) and mint new ones without \"/\", or start without --runner-clusters", ErrReservedRunnerIDs, n)
	}
	return nil
}

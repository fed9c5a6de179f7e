// Package enroll is the Runner's client of the Server's RunnerService door:
// connect-go speaking gRPC over HTTPS, a bearer token from the Runner's token
// source on every call, Unavailable retried with capped jittered backoff.
package enroll

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"

	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/runner"
)

// Config configures a Client.
type Config struct {
	ServerURL string // https://host:port of the door
	CAFile    string // optional PEM CA for the door's certificate
	Tokens    runner.TokenSource
	Retry     runner.Retry
	Logger    *slog.Logger
	// HTTPClient overrides the client built from ServerURL and CAFile (tests).
	HTTPClient connect.HTTPClient
}

// Client enrolls a Runner; it implements runner.Enroller.
type Client struct {
	rpc   runnerv1connect.RunnerServiceClient
	retry runner.Retry
	log   *slog.Logger
}

// New builds a Client. The URL must be https://.
func New(cfg Config) (*Client, error) {
	if cfg.Tokens == nil {
		return nil, runner.ErrNoToken
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	hc := cfg.HTTPClient
	if hc == nil {
		c, err := runner.DoorHTTPClient(cfg.ServerURL, cfg.CAFile)
		if err != nil {
			return nil, err
		}
		hc = c
	}
	if cfg.Retry.Logger == nil {
		cfg.Retry.Logger = cfg.Logger
	}
	rpc := runnerv1connect.NewRunnerServiceClient(hc, cfg.ServerURL, connect.WithGRPC(),
		connect.WithInterceptors(runner.NewBearerInterceptor(cfg.Tokens, cfg.Logger)))
	return &Client{rpc: rpc, retry: cfg.Retry, log: cfg.Logger}, nil
}

// Enroll calls RunnerService.Enroll until it succeeds, fails with an error
// other than Unavailable, or ctx ends. Each attempt asks the token source
// afresh and is bounded by runner.EnrollAttemptTimeout.
func (c *Client) Enroll(ctx context.Context, req runner.EnrollRequest) (runner.EnrollResult, error) {
	var res *runnerv1.EnrollResponse
	err := c.retry.Do(ctx, "Enroll", func(ctx context.Context) error {
		r, err := c.rpc.Enroll(ctx, connect.NewRequest(&runnerv1.EnrollRequest{
			RunnerId: req.RunnerID, Version: req.Version, Hostname: req.Hostname}))
		if err != nil {
			return err
		}
		res = r.Msg
		return nil
	})
	if err != nil {
		// The Runner wraps it as "runner: enroll: ...": no prefix of its own.
		return runner.EnrollResult{}, err
	}
	if res.GetRunnerId() == "" {
		return runner.EnrollResult{}, errors.New("the Server returned no runner_id (a Server older than DL-440?)")
	}
	return runner.EnrollResult{RunnerID: res.GetRunnerId(), ServerVersion: res.GetServerVersion(), NATSURL: res.GetNatsUrl()}, nil
}

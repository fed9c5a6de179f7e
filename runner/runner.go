package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/subjects"
)

// plaintextHint ends the error for a plaintext NATS URL.
const plaintextHint = "; use tls:// (with --nats-ca-file for a private CA), or --allow-plaintext-nats to send the token unprotected anyway"

// Defaults of the Runner, each with its reason.
const (
	// DefaultHealthAddr is where /healthz and /readyz are served: loopback
	// only, so nothing off the host reads them unless asked. The deploy
	// manifests set the pod's own address, where the kubelet probes.
	DefaultHealthAddr = "127.0.0.1:8081"
	// DefaultHeartbeat is how often the heartbeat event is published: often
	// enough for the Server to notice a dead Runner within a minute, rare
	// enough that ten thousand Runners publish a few hundred messages a second.
	DefaultHeartbeat = 30 * time.Second
	// healthShutdown bounds the health server's graceful shutdown.
	healthShutdown = 2 * time.Second
	// healthReadTimeout bounds a probe request's headers (slowloris).
	healthReadTimeout = 5 * time.Second
)

// EnrollRequest is what the Runner tells the Server when it enrolls.
type EnrollRequest struct {
	RunnerID string // empty with a token file: the Server assigns it
	Version  string
	Hostname string
}

// EnrollResult is the Server's answer.
type EnrollResult struct {
	RunnerID      string // the Server-assigned Runner ID, used for everything after
	ServerVersion string
	NATSURL       string // optional; the flag/env value wins
}

// Enroller enrolls the Runner over the Server's door (see runner/door).
type Enroller interface {
	Enroll(ctx context.Context, req EnrollRequest) (EnrollResult, error)
}

// Config configures a Runner.
type Config struct {
	RunnerID  string // required without an Enroller; optional with a token file
	Version   string
	Hostname  string
	Tokens    TokenSource
	TokenFile string // the token file, for the mount guard ("" with a static token)
	Enroller  Enroller
	NATSURL   string
	// AllowPlaintextNATS lets the Runner send its token over a nats:// (or
	// ws://) URL to a host that is not loopback. The token is valid at the
	// TLS-only door until exp plus the leeway, so anyone on that path could
	// enroll as this Runner: off by default, and loudly logged when on.
	AllowPlaintextNATS bool
	Mounts             []Mount
	// HealthAddr serves /healthz, /readyz and /metrics ("" disables).
	HealthAddr string
	// Metrics are the Runner's metrics (NewMetrics when nil), served at
	// /metrics on HealthAddr.
	Metrics *Metrics
	// Heartbeat is the heartbeat period (DefaultHeartbeat when zero; negative disables).
	Heartbeat time.Duration
	// Link tunes the NATS link; URL, RunnerID, Tokens and Handler are filled in.
	Link LinkConfig

	Logger *slog.Logger
	Now    func() time.Time
	// OnReady, if set, is called once the Runner is enrolled and has its
	// command subscription on a connected server.
	OnReady func(id string)
}

// Runner is one Compass Runner.
type Runner struct {
	cfg     Config
	log     *slog.Logger
	started time.Time

	metrics *Metrics

	id       atomic.Pointer[string]
	enrolled atomic.Bool
	link     atomic.Pointer[Link]
	readyMu  sync.Once
}

// New checks cfg (mutually exclusive token sources are checked by
// NewTokenSource; here the mount guard and the Runner ID) and returns a Runner.
func New(cfg Config) (*Runner, error) {
	if cfg.Tokens == nil {
		return nil, ErrNoToken
	}
	if err := CheckMounts(cfg.Mounts, cfg.TokenFile); err != nil {
		return nil, err
	}
	if cfg.Enroller == nil && cfg.RunnerID == "" {
		return nil, errors.New("runner: --runner-id is required without a Server to enroll with")
	}
	if cfg.RunnerID == "" && cfg.TokenFile == "" {
		return nil, errors.New("runner: --runner-id is required with a static token (only a token file lets the Server assign the ID)")
	}
	if cfg.RunnerID != "" {
		if err := subjects.ValidSubjectToken(cfg.RunnerID); err != nil {
			return nil, fmt.Errorf("runner: --runner-id: %w", err)
		}
	}
	if cfg.NATSURL != "" && !cfg.AllowPlaintextNATS {
		if err := natsurl.CheckSealed(cfg.NATSURL); err != nil {
			return nil, fmt.Errorf("runner: --nats-url: %w%s", err, plaintextHint)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	r := &Runner{cfg: cfg, log: cfg.Logger, started: cfg.Now(), metrics: cfg.Metrics}
	if err := cfg.Metrics.Register(runnerCollector{r}); err != nil {
		return nil, fmt.Errorf("runner: metrics (one Metrics per Runner): %w", err)
	}
	return r, nil
}

// ID is the Runner ID in use ("" before enrollment when the Server assigns it).
func (r *Runner) ID() string {
	if p := r.id.Load(); p != nil {
		return *p
	}
	return r.cfg.RunnerID
}

// Ready reports whether the Runner is enrolled and connected to NATS.
func (r *Runner) Ready() bool {
	l := r.link.Load()
	return r.enrolled.Load() && l != nil && l.Connected()
}

// Link is the NATS link once enrolled (nil before).
func (r *Runner) Link() *Link { return r.link.Load() }

// Run enrolls, connects and serves until ctx ends, then drains: the command
// subscription is unsubscribed, in-flight commands finish and their replies
// are flushed, then the connection closes.
func (r *Runner) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	// Returning early (enrollment refused) must also stop the health server
	// and the heartbeat, which wait on ctx: cancel runs before wg.Wait.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if r.cfg.HealthAddr != "" {
		ln, err := net.Listen("tcp", r.cfg.HealthAddr)
		if err != nil {
			return fmt.Errorf("runner: health listener: %w", err)
		}
		srv := &http.Server{Handler: r.HealthHandler(), ReadHeaderTimeout: healthReadTimeout}
		r.log.Info("runner: serving /healthz, /readyz and /metrics", "addr", ln.Addr().String())
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.log.Error("runner: health server", "err", err)
			}
		}()
		go func() {
			defer wg.Done()
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthShutdown)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}

	id, natsURL := r.cfg.RunnerID, r.cfg.NATSURL
	if r.cfg.Enroller != nil {
		res, err := r.cfg.Enroller.Enroll(ctx, EnrollRequest{RunnerID: r.cfg.RunnerID, Version: r.cfg.Version, Hostname: r.cfg.Hostname})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("runner: enroll: %w", err)
		}
		if err := subjects.ValidSubjectToken(res.RunnerID); err != nil {
			return fmt.Errorf("runner: enroll: the Server assigned an unusable Runner ID: %w", err)
		}
		if r.cfg.RunnerID != "" && res.RunnerID != r.cfg.RunnerID {
			r.log.Warn("runner: the Server assigned a different Runner ID than --runner-id; using the Server's", "configured", r.cfg.RunnerID, "assigned", res.RunnerID)
		}
		id = res.RunnerID
		if natsURL == "" {
			natsURL = res.NATSURL
		}
		r.log.Info("runner: enrolled", "runner_id", id, "server_version", res.ServerVersion)
	}
	if natsURL == "" {
		return errors.New("runner: no NATS URL: set --nats-url or COMPASS_NATS_URL, or let the Server return one at enrollment")
	}
	if err := natsurl.CheckSealed(natsURL); err != nil {
		if !r.cfg.AllowPlaintextNATS {
			return fmt.Errorf("runner: the NATS URL would carry the token in clear text: %w%s", err, plaintextHint)
		}
		r.log.Warn("runner: SENDING THE RUNNER TOKEN IN CLEAR TEXT to a non-loopback NATS server (--allow-plaintext-nats): anyone on the path can use it at the door until it expires",
			"error", err)
	}
	r.id.Store(&id)
	r.enrolled.Store(true)

	// Commands run under a context that survives the drain, so the ones in
	// flight at shutdown finish; it ends when Run returns.
	cmdCtx, cancelCmds := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCmds()
	cmds := NewCommands(cmdCtx, map[string]CommandFunc{"ping": r.ping, "info": r.info}, r.log)
	cmds.metrics = r.metrics
	r.metrics.knownCommands(cmds.table)

	lc := r.cfg.Link
	lc.URL, lc.RunnerID, lc.Tokens, lc.Handler = natsURL, id, r.cfg.Tokens, cmds.Handle
	lc.AllowPlaintext = r.cfg.AllowPlaintextNATS
	if lc.Logger == nil {
		lc.Logger = r.log
	}
	if lc.Now == nil {
		lc.Now = r.cfg.Now
	}
	user := lc.OnEvent
	lc.OnEvent = func(ev LinkEvent) {
		r.metrics.observeLink(ev)
		if ev.Kind == EventConnected && r.cfg.OnReady != nil {
			r.readyMu.Do(func() { r.cfg.OnReady(id) })
		}
		if user != nil {
			user(ev)
		}
	}
	link, err := NewLink(lc)
	if err != nil {
		return err
	}
	r.link.Store(link)
	if r.cfg.Heartbeat > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.heartbeat(ctx, link, id)
		}()
	}
	return link.Run(ctx)
}

// heartbeat publishes {"runner_id","time","uptime_seconds"} on the heartbeat
// event subject every period until ctx ends.
func (r *Runner) heartbeat(ctx context.Context, link *Link, id string) {
	subj, err := subjects.Event(id, "heartbeat")
	if err != nil {
		r.log.Error("runner: heartbeat subject", "err", err)
		return
	}
	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !link.Connected() {
				continue // a stale heartbeat replayed after a reconnect would lie
			}
			now := r.cfg.Now()
			data, _ := json.Marshal(map[string]any{"runner_id": id, "time": now.UTC(), "uptime_seconds": int64(now.Sub(r.started).Seconds())})
			if err := link.Publish(subj, data); err != nil {
				r.log.Warn("runner: heartbeat", "err", err)
			}
		}
	}
}

// PingResult is the result of ping.
type PingResult struct {
	Pong     bool      `json:"pong"`
	RunnerID string    `json:"runner_id"`
	Time     time.Time `json:"time"`
}

func (r *Runner) ping(_ context.Context, args json.RawMessage) (any, error) {
	if err := noArgs(args); err != nil {
		return nil, err
	}
	return PingResult{Pong: true, RunnerID: r.ID(), Time: r.cfg.Now().UTC()}, nil
}

// InfoResult is the result of info.
type InfoResult struct {
	RunnerID      string     `json:"runner_id"`
	Version       string     `json:"version"`
	Hostname      string     `json:"hostname,omitempty"`
	Started       time.Time  `json:"started"`
	Uptime        string     `json:"uptime"`
	UptimeSeconds int64      `json:"uptime_seconds"`
	TokenSource   string     `json:"token_source"`
	TokenExpiry   *time.Time `json:"token_expiry"` // null for an opaque minted token
	NATS          NATSInfo   `json:"nats"`
	Mounts        []string   `json:"mounts,omitempty"`
}

// NATSInfo is the NATS part of info.
type NATSInfo struct {
	Connected  bool   `json:"connected"`
	ServerURL  string `json:"server_url,omitempty"`
	ServerID   string `json:"server_id,omitempty"`
	Session    int    `json:"session"`
	Handovers  int64  `json:"early_reconnects"`
	Reconnects int64  `json:"reconnects"`
}

func (r *Runner) info(_ context.Context, args json.RawMessage) (any, error) {
	if err := noArgs(args); err != nil {
		return nil, err
	}
	now := r.cfg.Now()
	up := now.Sub(r.started)
	res := InfoResult{
		RunnerID: r.ID(), Version: r.cfg.Version, Hostname: r.cfg.Hostname,
		Started: r.started.UTC(), Uptime: up.Round(time.Second).String(), UptimeSeconds: int64(up.Seconds()),
		TokenSource: r.tokenSource(),
	}
	if e, ok := r.cfg.Tokens.(Expirer); ok {
		if exp, ok := e.Expiry(); ok {
			exp = exp.UTC()
			res.TokenExpiry = &exp
		}
	}
	if l := r.link.Load(); l != nil {
		st := l.Status()
		res.NATS = NATSInfo{Connected: st.Connected, ServerURL: st.ServerURL, ServerID: st.ServerID,
			Session: st.Session, Handovers: st.Handovers, Reconnects: st.Reconnects}
	}
	for _, m := range r.cfg.Mounts {
		res.Mounts = append(res.Mounts, m.String())
	}
	return res, nil
}

// HealthHandler serves /healthz (the process is alive), /readyz (enrolled
// and connected to NATS) and /metrics (the Runner's Metrics).
func (r *Runner) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", r.metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch l := r.link.Load(); {
		case !r.enrolled.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not enrolled")
		case l == nil || !l.Connected():
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "NATS not connected")
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	return mux
}

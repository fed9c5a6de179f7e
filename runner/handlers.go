package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/nats-io/nats.go"
)

// MaxCommandBytes caps a command request before it is decoded. ping and info
// take no arguments; future commands carry small argument objects. NATS
// allows 1 MiB payloads by default, which a Runner need not parse.
const MaxCommandBytes = 64 << 10

// Request is the command envelope: {"command":"ping","args":{}}.
type Request struct {
	Command string          `json:"command"`
	Args    json.RawMessage `json:"args,omitempty"`
}

// Response is the answer envelope: {"ok":true,"result":{...}} or
// {"ok":false,"error":"..."}.
type Response struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// CommandFunc runs one command. Its error is sent to the caller, so it must
// not contain secrets.
type CommandFunc func(ctx context.Context, args json.RawMessage) (any, error)

// Commands is the command table.
type Commands struct {
	table map[string]CommandFunc
	known string
	log   *slog.Logger
	ctx   context.Context
	// metrics counts commands and replies (nil: not counted).
	metrics *Metrics
}

// NewCommands returns a dispatcher over table. Commands run under ctx (which
// should outlive the drain so in-flight commands can finish).
func NewCommands(ctx context.Context, table map[string]CommandFunc, log *slog.Logger) *Commands {
	names := make([]string, 0, len(table))
	for n := range table {
		names = append(names, n)
	}
	sort.Strings(names)
	if log == nil {
		log = slog.Default()
	}
	return &Commands{table: table, known: strings.Join(names, ", "), log: log, ctx: ctx}
}

// Dispatch decodes one request and runs it.
func (c *Commands) Dispatch(data []byte) Response {
	resp, name, outcome := c.dispatch(data)
	if c.metrics != nil {
		_, known := c.table[name]
		c.metrics.observeCommand(name, known, outcome)
	}
	return resp
}

// dispatch is Dispatch; it also returns the command's name and the outcome
// (CommandOK, ...) for the metrics.
func (c *Commands) dispatch(data []byte) (Response, string, string) {
	if len(data) > MaxCommandBytes {
		return Response{Error: fmt.Sprintf("request too large: %d bytes, the limit is %d", len(data), MaxCommandBytes)}, "", CommandInvalid
	}
	var req Request
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Response{Error: "invalid request: want {\"command\":\"<name>\",\"args\":{}}: " + err.Error()}, "", CommandInvalid
	}
	fn, ok := c.table[req.Command]
	if !ok {
		return Response{Error: fmt.Sprintf("unknown command %q; known: %s", req.Command, c.known)}, req.Command, CommandUnknown
	}
	res, err := fn(c.ctx, req.Args)
	if err != nil {
		return Response{Error: req.Command + ": " + err.Error()}, req.Command, CommandError
	}
	raw, err := json.Marshal(res)
	if err != nil {
		return Response{Error: req.Command + ": encode result: " + err.Error()}, req.Command, CommandError
	}
	return Response{OK: true, Result: raw}, req.Command, CommandOK
}

// Handle is the NATS handler: it answers on the message's reply subject.
func (c *Commands) Handle(m *nats.Msg) {
	resp := c.Dispatch(m.Data)
	if m.Reply == "" {
		return
	}
	data, _ := json.Marshal(resp) // a Response always encodes
	err := m.Respond(data)
	if c.metrics != nil {
		c.metrics.observeReply(err)
	}
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		c.log.Warn("runner: reply to command failed", "err", err)
	}
}

// noArgs rejects arguments for commands that take none.
func noArgs(args json.RawMessage) error {
	s := strings.TrimSpace(string(args))
	if s == "" || s == "{}" || s == "null" {
		return nil
	}
	return errors.New("takes no arguments")
}

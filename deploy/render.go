package deploy

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"strings"
	"text/template"
	"time"
)

//go:embed templates/*.tmpl
var templateFS embed.FS

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"q":      quote,
	"indent": indent,
}).Option("missingkey=error").ParseFS(templateFS, "templates/*.tmpl"))

// view is what the templates see: validated parameters plus derived values.
type view struct {
	Params
	PolicyName, ServiceAccount, DaemonSet, Audience string
	TokenDir, TokenPath                             string
	TokenExpirationSeconds, MaxTokenLifetimeSeconds int64
	ControllersCEL, DeployersCEL                    string
	NATSTLS                                         bool
	NATSConfig                                      string
}

// Render validates p and renders the manifests as one multi-document YAML
// stream: the Runner's namespace, admission policy and binding, ServiceAccount
// and DaemonSet; then the callout's namespace, ServiceAccount, nats-server
// ConfigMap, Deployment, PodDisruptionBudget and metrics Service; then, when
// p.NATSImage is set, a nats-server Deployment and Service.
func Render(p Params) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	v, err := newView(p)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for _, name := range []string{"runner.yaml.tmpl", "callout.yaml.tmpl"} {
		if err := templates.ExecuteTemplate(&buf, name, v); err != nil {
			return nil, fmt.Errorf("deploy: render %s: %w", name, err)
		}
	}
	return buf.Bytes(), nil
}

// RenderNATSConfig validates p and renders only the nats-server configuration
// that Render puts in the compass-nats-config ConfigMap.
func RenderNATSConfig(p Params) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	v, err := newView(p)
	if err != nil {
		return nil, err
	}
	return []byte(v.NATSConfig), nil
}

func newView(p Params) (view, error) {
	v := view{
		Params:                  p,
		PolicyName:              PolicyName,
		ServiceAccount:          RunnerServiceAccount,
		DaemonSet:               RunnerDaemonSet,
		Audience:                TokenAudience,
		TokenDir:                TokenDir,
		TokenPath:               TokenPath,
		TokenExpirationSeconds:  int64(p.TokenExpiration / time.Second),
		MaxTokenLifetimeSeconds: int64(p.MaxTokenLifetime / time.Second),
		ControllersCEL:          celStringList(p.Controllers),
		DeployersCEL:            celStringList(p.Deployers),
		NATSTLS:                 strings.Contains(p.NATSURL, "tls://"),
	}
	if v.NATSCalloutIssuer == "" {
		v.NATSCalloutIssuer = PlaceholderIssuer
	}
	if v.NATSCalloutXKey == "" {
		v.NATSCalloutXKey = PlaceholderXKey
	}
	var conf bytes.Buffer
	if err := templates.ExecuteTemplate(&conf, "nats-server.conf.tmpl", v); err != nil {
		return view{}, fmt.Errorf("deploy: render nats-server.conf.tmpl: %w", err)
	}
	v.NATSConfig = conf.String()
	return v, nil
}

// celStringList writes names as a CEL list of single-quoted string literals.
// validUsers has refused every name holding a quote, a backslash or a
// non-printable character, so no name can end or escape its literal.
func celStringList(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = "'" + n + "'"
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// quote writes s as a YAML double-quoted scalar (a JSON string is one).
func quote(s string) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return "", fmt.Errorf("deploy: quote: %w", err)
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

// indent prefixes every non-empty line of s with n spaces (for block scalars).
func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = pad + l
		}
	}
	return strings.Join(lines, "\n")
}

package main

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

// The image layout every Compass image shares. The binary is the entrypoint
// and the only executable; there is no shell, so `kubectl exec` can run the
// program itself and nothing else.
const (
	binDir = "/usr/local/bin"
	// nonroot is the user and group the program runs as: 65532, the
	// "nonroot" of distroless images, which Kubernetes' runAsNonRoot accepts
	// and which owns nothing in the image but its home directory.
	nonroot          = 65532
	user             = "65532:65532"
	homeDir          = "/home/nonroot"
	caFile           = "/etc/ssl/certs/ca-certificates.crt"
	pathEnv          = "PATH=" + binDir
	imageOS          = "linux"
	buildinfoPackage = "github.com/compass-runner/identity/internal/lib/buildinfo"
)

// Limits on what the tool is given, each with its reason.
const (
	// maxBinary bounds the binary read into memory to build its layer; the
	// Compass binaries are about 30 MiB.
	maxBinary = 512 << 20
	// maxEpoch is the last second of year 9999: org.opencontainers.image.created
	// is RFC 3339, which has four-digit years.
	maxEpoch = 253402300799
	// maxName is a DNS label's length; a program name becomes a repository
	// path component and the image title.
	maxName = 63
	// maxLicenses bounds the SPDX expression put in a label.
	maxLicenses = 256
)

// OCI label and annotation keys (image-spec annotations.md).
const (
	labelTitle    = "org.opencontainers.image.title"
	labelVersion  = "org.opencontainers.image.version"
	labelRevision = "org.opencontainers.image.revision"
	labelSource   = "org.opencontainers.image.source"
	labelCreated  = "org.opencontainers.image.created"
	labelLicenses = "org.opencontainers.image.licenses"
	annRefName    = "org.opencontainers.image.ref.name"
)

var (
	nameRE = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	// versionRE is a semantic version with a leading v and no build
	// metadata: "+" is not allowed in an image tag.
	versionRE  = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)
	revisionRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)
	licensesRE = regexp.MustCompile(`^[A-Za-z0-9.+:() -]+$`)
)

// archs are the GOARCH values an image can be built for, with their OCI
// platform variant.
var archs = map[string]string{"amd64": "", "arm64": "v8"}

// Spec is what one image is made of, apart from its binary.
type Spec struct {
	Name       string    // program name: the binary's file name and the image title
	Version    string    // the image tag and the version the binary reports
	Revision   string    // the VCS commit the binary was built from
	Source     string    // URL of the source repository
	Licenses   string    // SPDX expression, or "" when not known (no label then)
	Repository string    // registry and namespace, e.g. ghcr.io/compass-runner
	Arch       string    // GOARCH of the binary
	Created    time.Time // SOURCE_DATE_EPOCH: every timestamp in the image
}

// Validate reports every field that is wrong, each with a specific error.
func (s Spec) Validate() error {
	var errs []error
	switch {
	case s.Name == "":
		errs = append(errs, errors.New("name is empty"))
	case len(s.Name) > maxName || !nameRE.MatchString(s.Name):
		errs = append(errs, fmt.Errorf("name %q is not lower-case letters and digits joined by single hyphens, at most %d characters", s.Name, maxName))
	}
	if !versionRE.MatchString(s.Version) {
		errs = append(errs, fmt.Errorf("version %q is not a semantic version with a leading v and no build metadata (v1.2.3, v1.2.3-rc.1)", s.Version))
	}
	if !revisionRE.MatchString(s.Revision) {
		errs = append(errs, fmt.Errorf("revision %q is not a full lower-case hex commit (40 or 64 digits)", s.Revision))
	}
	if u, err := url.Parse(s.Source); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		errs = append(errs, fmt.Errorf("source %q is not an https URL without credentials, query or fragment", s.Source))
	}
	if s.Licenses != "" && (len(s.Licenses) > maxLicenses || !licensesRE.MatchString(s.Licenses)) {
		errs = append(errs, fmt.Errorf("licenses %q is not an SPDX expression of at most %d characters", s.Licenses, maxLicenses))
	}
	if _, ok := archs[s.Arch]; !ok {
		errs = append(errs, fmt.Errorf("arch %q is not one of amd64, arm64", s.Arch))
	}
	if sec := s.Created.Unix(); sec < 0 || sec > maxEpoch || s.Created.Nanosecond() != 0 {
		errs = append(errs, fmt.Errorf("created %s is not a whole second from 1970 to 9999", s.Created.UTC().Format(time.RFC3339Nano)))
	}
	if len(errs) == 0 {
		if _, err := name.NewTag(s.Ref(), name.StrictValidation); err != nil {
			errs = append(errs, fmt.Errorf("repository %q: %w", s.Repository, err))
		}
	}
	return errors.Join(errs...)
}

// Ref is the reference the image is tagged with: repository/name:version.
func (s Spec) Ref() string { return s.Repository + "/" + s.Name + ":" + s.Version }

// Entrypoint is the binary's path in the image.
func (s Spec) Entrypoint() string { return binDir + "/" + s.Name }

// Labels are the image's OCI labels, which are also its manifest's
// annotations.
func (s Spec) Labels() map[string]string {
	l := map[string]string{
		labelTitle:    s.Name,
		labelVersion:  s.Version,
		labelRevision: s.Revision,
		labelSource:   s.Source,
		labelCreated:  s.Created.UTC().Format(time.RFC3339),
	}
	if s.Licenses != "" {
		l[labelLicenses] = s.Licenses
	}
	return l
}

// Module tools/images assembles and checks the Compass OCI images (.ci/images).
// It is its own module so go-containerregistry and the CA bundle's module
// never enter the main module or the daemons' dependency graph.
// klauspost/compress is raised above go-containerregistry's v1.19.2, which
// has GO-2026-6865 (govulncheck in .ci/images).
module github.com/compass-runner/identity/tools/images

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/crypto/x509roots/fallback v0.0.0-20261030153154-30a33513ff6d
)

require (
	github.com/docker/cli v29.7.2+incompatible // indirect
	github.com/docker/docker-credential-helpers v0.9.3 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/klauspost/compress v1.20.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	gotest.tools/v3 v3.5.2 // indirect
)

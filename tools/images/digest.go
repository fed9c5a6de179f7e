package main

// The digest a registry serves for a reference: how the release pins an
// image it does not build (the chart's NATS image) to what the registry
// holds under its tag at release time.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// digestTimeout bounds the wait for the registry's answer: a release must
// fail, not hang, on a registry that accepts the connection and never
// replies. Docker Hub answers a HEAD of a manifest within a second or two.
const digestTimeout = 2 * time.Minute

// Digest is the digest the registry serves for ref: the image index's, or
// the image manifest's where the tag names one image, as the registry
// answers a HEAD of it. A registry that answers no HEAD is asked with a
// GET, whose body go-containerregistry hashes. Anything else than an image
// index or an image manifest, or a digest not sha256, is refused: images.env
// and the chart pin images by sha256.
func Digest(ref name.Reference, opts ...remote.Option) (v1.Hash, error) {
	d, err := remote.Head(ref, opts...)
	if err != nil {
		got, gerr := remote.Get(ref, opts...)
		if gerr != nil {
			return v1.Hash{}, fmt.Errorf("digest: %s: %w", ref, gerr)
		}
		d = &got.Descriptor
	}
	if !d.MediaType.IsIndex() && !d.MediaType.IsImage() {
		return v1.Hash{}, fmt.Errorf("digest: %s is a %s, not an image index or an image manifest", ref, d.MediaType)
	}
	if !digestRE.MatchString(d.Digest.String()) {
		return v1.Hash{}, fmt.Errorf("digest: %s is served as %s, not by a sha256 digest", ref, d.Digest)
	}
	if dr, ok := ref.(name.Digest); ok && dr.DigestStr() != d.Digest.String() {
		return v1.Hash{}, fmt.Errorf("digest: the registry serves %s as %s", ref, d.Digest)
	}
	return d.Digest, nil
}

func runDigest(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("digest", flag.ContinueOnError)
	ref := fs.String("ref", "", "the image, REGISTRY/REPOSITORY:TAG (or @DIGEST), e.g. docker.io/library/nats:2.15.2-alpine (required)")
	insecure := fs.Bool("insecure", false, "plain HTTP: only for a registry on this machine (a test, a dry run)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *ref == "" {
		return usageError{"--ref is required"}
	}
	// The registry is named: a release reads from where it says, never
	// from a default.
	nameOpts := []name.Option{name.StrictValidation}
	if *insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	r, err := name.ParseReference(*ref, nameOpts...)
	if err != nil {
		return usageError{fmt.Sprintf("--ref %q: %v (name the registry, the whole repository path and a tag or digest: docker.io/library/nats:2.15.2-alpine)", *ref, err)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), digestTimeout)
	defer cancel()
	// Credentials as crane and docker keep them (crane auth login); none is
	// needed for a public image.
	d, err := Digest(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, d)
	return nil
}

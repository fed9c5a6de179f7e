package main

import (
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Push copies the multi-platform layout at dir (index writes it) to the
// registry: the image index tagged as tag, then each SBOM artifact by its
// digest in the same repository, so a registry with the referrers API lists
// it under its image. The bytes are the layout's: the pushed index has the
// digest .ci/images printed, and Push returns it.
func Push(dir string, tag name.Tag, opts ...remote.Option) (v1.Hash, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push: layout %s: %w", dir, err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push: layout %s: %w", dir, err)
	}
	var index *v1.Descriptor
	var arts []v1.Descriptor
	for i, d := range tm.Manifests {
		switch {
		case d.MediaType == types.OCIImageIndex && index == nil:
			index = &tm.Manifests[i]
		case d.MediaType == types.OCIManifestSchema1 && d.ArtifactType == string(sbomType):
			arts = append(arts, d)
		default:
			return v1.Hash{}, fmt.Errorf("push: layout %s: entry %s (%s) is not the one image index or an SBOM; build it with images index", dir, d.Digest, d.MediaType)
		}
	}
	if index == nil {
		return v1.Hash{}, fmt.Errorf("push: layout %s has no image index; build it with images index", dir)
	}
	idx, err := top.ImageIndex(index.Digest)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push: %w", err)
	}
	if err := remote.WriteIndex(tag, idx, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push: %s: %w", tag, err)
	}
	// What the registry now serves under the tag, not what was sent: a
	// registry that rewrote the index (or a tag moved by someone else in
	// between) fails the push.
	got, err := remote.Head(tag, opts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push: %s: reading the tag back: %w", tag, err)
	}
	if got.Digest != index.Digest {
		return v1.Hash{}, fmt.Errorf("push: %s: the registry serves %s, not the pushed %s", tag, got.Digest, index.Digest)
	}
	var errs []error
	for _, d := range arts {
		art, err := top.Image(d.Digest)
		if err == nil {
			err = remote.Write(tag.Context().Digest(d.Digest.String()), art, opts...)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("push: sbom %s: %w", d.Digest, err))
		}
	}
	return index.Digest, errors.Join(errs...)
}

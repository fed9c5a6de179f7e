package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// platform is the image's platform, as the layout's index names it.
func (s Spec) platform() v1.Platform {
	return v1.Platform{OS: imageOS, Architecture: s.Arch, Variant: archs[s.Arch]}
}

// WriteLayout writes img as the only image of a new OCI image layout at dir,
// named by s.Ref() (org.opencontainers.image.ref.name), and returns its
// manifest digest. dir must not exist: a layout is never added to, so two
// builds of one revision give byte-identical directories.
func WriteLayout(dir string, s Spec, img v1.Image) (v1.Hash, error) {
	p, err := newLayout(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendImage(img,
		layout.WithAnnotations(map[string]string{annRefName: s.Ref()}),
		layout.WithPlatform(s.platform()),
	); err != nil {
		return v1.Hash{}, fmt.Errorf("layout %s: %w", dir, err)
	}
	d, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("layout %s: %w", dir, err)
	}
	return d, nil
}

// newLayout starts an empty OCI image layout at dir, which must not exist:
// a layout is never added to, so two builds of one revision give
// byte-identical directories.
func newLayout(dir string) (layout.Path, error) {
	if _, err := os.Lstat(dir); err == nil {
		return "", fmt.Errorf("layout %s already exists; remove it first", dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("layout: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("layout %s: %w", dir, err)
	}
	return p, nil
}

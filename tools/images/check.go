package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// shells are file names that would give an attacker who reaches the
// container a command interpreter; the image has none, and Check names one
// it finds as such.
var shells = []string{"sh", "bash", "dash", "ash", "zsh", "ksh", "busybox", "toybox"}

// Report is what Check found, for printing.
type Report struct {
	Ref        string
	Digest     v1.Hash
	User       string
	Entrypoint []string
	Labels     map[string]string
	Layers     []LayerReport
	Roots      int
	BinarySize int
	BinarySum  string // sha256 of the binary, hex
}

// LayerReport is one layer's digest, compressed size and entry count.
type LayerReport struct {
	Digest  v1.Hash
	Size    int64
	Entries int
}

// Check reads the OCI layout at dir through go-containerregistry (not the
// code that wrote it) and compares it, field by field and file by file, with
// what Build makes of s: one image named s.Ref() for the platform, blobs that
// match their digests, the OCI media types, the config (user, entrypoint,
// environment, working directory, labels, created), the history, and each
// layer's exact entries with their modes, owners and timestamps, so nothing
// else (a shell, a stray file, a build-time mtime) can be in it. The binary
// must be a static Linux ELF stamped with s's version and revision. When
// extractTo is not empty the binary is written there, executable, for the
// caller to run.
//
// Every mismatch is reported, joined in one error.
func Check(dir string, s Spec, extractTo string) (Report, error) {
	if err := s.Validate(); err != nil {
		return Report{}, err
	}
	ca, roots, err := caBundle()
	if err != nil {
		return Report{}, err
	}
	rep := Report{Ref: s.Ref(), Roots: roots}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return rep, fmt.Errorf("layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return rep, fmt.Errorf("layout %s: index: %w", dir, err)
	}
	if im.MediaType != types.OCIImageIndex {
		return rep, fmt.Errorf("layout %s: index media type is %q, not %q", dir, im.MediaType, types.OCIImageIndex)
	}
	if len(im.Manifests) != 1 {
		return rep, fmt.Errorf("layout %s: index has %d manifests, not 1", dir, len(im.Manifests))
	}
	desc := im.Manifests[0]
	rep.Digest = desc.Digest

	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if desc.MediaType != types.OCIManifestSchema1 {
		bad("index entry media type is %q, not %q", desc.MediaType, types.OCIManifestSchema1)
	}
	if !reflect.DeepEqual(desc.Annotations, map[string]string{annRefName: s.Ref()}) {
		bad("index entry annotations are %v, not %s=%s", desc.Annotations, annRefName, s.Ref())
	}
	if want := s.platform(); desc.Platform == nil || !desc.Platform.Equals(want) {
		bad("index entry platform is %v, not %v", desc.Platform, want)
	}

	img, err := idx.Image(desc.Digest)
	if err != nil {
		return rep, errors.Join(append(errs, fmt.Errorf("image %s: %w", desc.Digest, err))...)
	}
	// Every blob's digest and size, every layer's diff ID, the manifest and
	// the config agree with each other.
	if err := validate.Image(img); err != nil {
		return rep, errors.Join(append(errs, fmt.Errorf("image %s does not validate: %w", desc.Digest, err))...)
	}

	m, err := img.Manifest()
	if err != nil {
		return rep, errors.Join(append(errs, fmt.Errorf("manifest: %w", err))...)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		bad("config media type is %q, not %q", m.Config.MediaType, types.OCIConfigJSON)
	}
	if !reflect.DeepEqual(m.Annotations, s.Labels()) {
		bad("manifest annotations are %v, not %v", m.Annotations, s.Labels())
	}

	cf, err := img.ConfigFile()
	if err != nil {
		return rep, errors.Join(append(errs, fmt.Errorf("config: %w", err))...)
	}
	rep.User, rep.Entrypoint, rep.Labels = cf.Config.User, cf.Config.Entrypoint, cf.Config.Labels
	errs = append(errs, checkConfig(cf, s)...)

	wantLayers := [][]entry{baseEntries(ca), binaryEntries(s, nil)}
	layers, err := img.Layers()
	if err != nil {
		return rep, errors.Join(append(errs, fmt.Errorf("layers: %w", err))...)
	}
	if len(layers) != len(wantLayers) {
		return rep, errors.Join(append(errs, fmt.Errorf("image has %d layers, not %d", len(layers), len(wantLayers)))...)
	}
	var bin []byte
	var execs []string
	for i, l := range layers {
		lr, got, err := readLayer(l)
		if err != nil {
			errs = append(errs, fmt.Errorf("layer %d: %w", i+1, err))
			continue
		}
		rep.Layers = append(rep.Layers, lr)
		for _, g := range got {
			if g.hdr.Typeflag == tar.TypeReg && g.hdr.Mode&0o111 != 0 {
				execs = append(execs, "/"+g.hdr.Name)
			}
			if g.hdr.Name == strings.TrimPrefix(s.Entrypoint(), "/") {
				bin = g.data
			}
		}
		errs = append(errs, compareLayer(i+1, got, wantLayers[i], s.Created, s.Entrypoint())...)
	}
	if !slices.Equal(execs, []string{s.Entrypoint()}) {
		bad("the executables in the image are %v, not only %s", execs, s.Entrypoint())
	}
	if bin == nil {
		return rep, errors.Join(append(errs, fmt.Errorf("image has no %s", s.Entrypoint()))...)
	}
	sum := sha256.Sum256(bin)
	rep.BinarySize, rep.BinarySum = len(bin), hex.EncodeToString(sum[:])
	if err := checkBinary(s, bin); err != nil {
		bad("%s: %w", s.Entrypoint(), err)
	}
	if err := errors.Join(errs...); err != nil {
		return rep, err
	}
	if extractTo != "" {
		if err := writeExecutable(extractTo, bin); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// checkConfig compares the image config with what Build writes.
func checkConfig(cf *v1.ConfigFile, s Spec) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	created := s.Created.UTC()
	if cf.OS != imageOS || cf.Architecture != s.Arch || cf.Variant != archs[s.Arch] {
		bad("config platform is %s/%s%s, not %v", cf.OS, cf.Architecture, variantSuffix(cf.Variant), s.platform())
	}
	if !cf.Created.Time.Equal(created) {
		bad("config created is %s, not %s", cf.Created.Time.UTC().Format(time.RFC3339), created.Format(time.RFC3339))
	}
	c := cf.Config
	if c.User != user {
		bad("config user is %q, not %q", c.User, user)
	}
	if !slices.Equal(c.Entrypoint, []string{s.Entrypoint()}) {
		bad("config entrypoint is %q, not [%q]", c.Entrypoint, s.Entrypoint())
	}
	if len(c.Cmd) != 0 {
		bad("config cmd is %q, not empty", c.Cmd)
	}
	if !slices.Equal(c.Env, []string{pathEnv}) {
		bad("config env is %q, not [%q]", c.Env, pathEnv)
	}
	if c.WorkingDir != homeDir {
		bad("config working dir is %q, not %q", c.WorkingDir, homeDir)
	}
	if !reflect.DeepEqual(c.Labels, s.Labels()) {
		bad("config labels are %v, not %v", c.Labels, s.Labels())
	}
	// Anything else set (ports, volumes, a healthcheck, a shell, a stop
	// signal) is not what Build writes.
	rest := c
	rest.User, rest.Entrypoint, rest.Cmd, rest.Env, rest.WorkingDir, rest.Labels = "", nil, nil, nil, "", nil
	if !reflect.DeepEqual(rest, v1.Config{}) {
		bad("config sets more than user, entrypoint, env, working dir and labels: %+v", rest)
	}
	wantHist := []string{historyBase, historyBinary(s)}
	if len(cf.History) != len(wantHist) {
		bad("config has %d history entries, not %d", len(cf.History), len(wantHist))
	} else {
		for i, h := range cf.History {
			if h.CreatedBy != wantHist[i] || !h.Created.Time.Equal(created) || h.EmptyLayer {
				bad("history %d is %q at %s (empty layer %t), not %q at %s", i+1, h.CreatedBy,
					h.Created.Time.UTC().Format(time.RFC3339), h.EmptyLayer, wantHist[i], created.Format(time.RFC3339))
			}
		}
	}
	return errs
}

func variantSuffix(v string) string {
	if v == "" {
		return ""
	}
	return "/" + v
}

type tarEntry struct {
	hdr  *tar.Header
	data []byte
}

// maxLayer bounds what one layer may expand to while read; above the
// binary's own limit by the few small files of the base layer.
const maxLayer = maxBinary + 16<<20

// readLayer reads every entry of a layer's uncompressed tar.
func readLayer(l v1.Layer) (LayerReport, []tarEntry, error) {
	var lr LayerReport
	var err error
	if lr.Digest, err = l.Digest(); err != nil {
		return lr, nil, err
	}
	if lr.Size, err = l.Size(); err != nil {
		return lr, nil, err
	}
	mt, err := l.MediaType()
	if err != nil {
		return lr, nil, err
	}
	if mt != types.OCILayer {
		return lr, nil, fmt.Errorf("media type is %q, not %q", mt, types.OCILayer)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return lr, nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(io.LimitReader(rc, maxLayer))
	var out []tarEntry
	total := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return lr, nil, fmt.Errorf("tar: %w", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return lr, nil, fmt.Errorf("tar entry %s: %w", h.Name, err)
		}
		if total += len(data); total >= maxLayer {
			return lr, nil, fmt.Errorf("layer expands past %d bytes", maxLayer)
		}
		out = append(out, tarEntry{hdr: h, data: data})
	}
	lr.Entries = len(out)
	return lr, out, nil
}

// compareLayer compares a layer's entries, in order, with want. The
// entrypoint's contents are not compared here (checkBinary reads them).
func compareLayer(n int, got []tarEntry, want []entry, created time.Time, entrypoint string) []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("layer %d: "+format, append([]any{n}, a...)...))
	}
	wantByName := map[string]entry{}
	for _, w := range want {
		wantByName[w.Name] = w
	}
	var gotNames, wantNames []string
	for _, w := range want {
		wantNames = append(wantNames, w.Name)
	}
	for _, g := range got {
		h := g.hdr
		gotNames = append(gotNames, h.Name)
		w, ok := wantByName[h.Name]
		if !ok {
			what := ""
			if slices.Contains(shells, path.Base(strings.TrimSuffix(h.Name, "/"))) {
				what = " (a shell)"
			}
			bad("unexpected entry /%s%s", h.Name, what)
			continue
		}
		wantType := byte(tar.TypeReg)
		if w.dir() {
			wantType = tar.TypeDir
		}
		if h.Typeflag != wantType || h.Linkname != "" {
			bad("/%s has type %q (link %q), not %q", h.Name, h.Typeflag, h.Linkname, wantType)
		}
		if h.Mode != w.Mode || h.Uid != w.UID || h.Gid != w.GID || h.Uname != "" || h.Gname != "" {
			bad("/%s is mode %#o owner %d:%d (%q:%q), not mode %#o owner %d:%d", h.Name, h.Mode, h.Uid, h.Gid, h.Uname, h.Gname, w.Mode, w.UID, w.GID)
		}
		if !h.ModTime.Equal(created) {
			bad("/%s has mtime %s, not %s", h.Name, h.ModTime.UTC().Format(time.RFC3339), created.UTC().Format(time.RFC3339))
		}
		if !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			bad("/%s has an access or change time", h.Name)
		}
		if len(h.PAXRecords) != 0 {
			bad("/%s has PAX records (extended attributes, long names) %v", h.Name, h.PAXRecords)
		}
		if !w.dir() && "/"+h.Name != entrypoint && !bytes.Equal(g.data, w.Data) {
			bad("/%s has other contents (%d bytes, not %d)", h.Name, len(g.data), len(w.Data))
		}
	}
	if !slices.Equal(gotNames, wantNames) {
		bad("entries are %v, not %v", gotNames, wantNames)
	}
	return errs
}

// writeExecutable writes b to p, mode 0755, through a temporary file in the
// same directory so p is never a partial binary.
func writeExecutable(p string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), ".extract-*")
	if err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("extract: %w", err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("extract: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	return nil
}

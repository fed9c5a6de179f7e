package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file or directory of a layer. Every entry has the image's
// Created time as its modification time, so a layer's bytes depend only on
// its contents.
type entry struct {
	Name     string // path without a leading slash; a directory ends in "/"
	Mode     int64  // permission bits, with the sticky bit where set
	UID, GID int
	Data     []byte // a regular file's contents; nil for a directory
}

func (e entry) dir() bool { return strings.HasSuffix(e.Name, "/") }

// baseEntries is the first layer, the same in every image: the user
// database (so the nonroot user has a name and a home), a writable /tmp and
// the CA bundle. Go's os/user and crypto/x509 read these without cgo.
func baseEntries(ca []byte) []entry {
	return []entry{
		{Name: "etc/", Mode: 0o755},
		{Name: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Name: "etc/ssl/", Mode: 0o755},
		{Name: "etc/ssl/certs/", Mode: 0o755},
		{Name: strings.TrimPrefix(caFile, "/"), Mode: 0o644, Data: ca},
		{Name: "home/", Mode: 0o755},
		{Name: strings.TrimPrefix(homeDir, "/") + "/", Mode: 0o700, UID: nonroot, GID: nonroot},
		{Name: "tmp/", Mode: 0o1777},
	}
}

// binaryEntries is the second layer: the binary, owned by root and not
// writable by the user it runs as.
func binaryEntries(s Spec, bin []byte) []entry {
	return []entry{
		{Name: "usr/", Mode: 0o755},
		{Name: "usr/local/", Mode: 0o755},
		{Name: "usr/local/bin/", Mode: 0o755},
		{Name: strings.TrimPrefix(s.Entrypoint(), "/"), Mode: 0o555, Data: bin},
	}
}

// layerTar is the uncompressed tar of entries, in the order given, in USTAR
// format with no user or group names: the same entries give the same bytes.
func layerTar(entries []entry, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name:    e.Name,
			Mode:    e.Mode,
			Uid:     e.UID,
			Gid:     e.GID,
			ModTime: mtime,
			Format:  tar.FormatUSTAR,
		}
		if e.dir() {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.Name, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// newLayer is an OCI gzip layer of tarBytes. compress/gzip at a fixed level
// with no name or time in its header is deterministic for a given Go
// toolchain, which .ci/images pins. The default level: BestCompression
// saves 3 % of a binary's layer and takes ten times as long (20 s).
func newLayer(tarBytes []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarBytes)), nil },
		tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressionLevel(gzip.DefaultCompression),
		tarball.WithCompressedCaching,
	)
}

// Build assembles the image of one binary. The result depends only on s
// and the binary's bytes.
func Build(s Spec, bin []byte) (v1.Image, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := checkBinary(s, bin); err != nil {
		return nil, err
	}
	ca, _, err := caBundle()
	if err != nil {
		return nil, err
	}
	base, err := layerTar(baseEntries(ca), s.Created)
	if err != nil {
		return nil, err
	}
	top, err := layerTar(binaryEntries(s, bin), s.Created)
	if err != nil {
		return nil, err
	}
	return assemble(s, base, top)
}

// assemble is the image of the two layer tars, with the config, history and
// annotations of s.
func assemble(s Spec, baseTar, topTar []byte) (v1.Image, error) {
	baseLayer, err := newLayer(baseTar)
	if err != nil {
		return nil, err
	}
	topLayer, err := newLayer(topTar)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: s.Created.UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: s.Arch,
		Variant:      archs[s.Arch],
		OS:           imageOS,
		Created:      created,
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			User:       user,
			Entrypoint: []string{s.Entrypoint()},
			Env:        []string{pathEnv},
			WorkingDir: homeDir,
			Labels:     s.Labels(),
		},
	})
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: baseLayer, History: v1.History{Created: created, CreatedBy: historyBase}},
		mutate.Addendum{Layer: topLayer, History: v1.History{Created: created, CreatedBy: historyBinary(s)}},
	)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, s.Labels()).(v1.Image), nil
}

const historyBase = "compass images: /etc/passwd, /etc/group, " + caFile + ", " + homeDir + ", /tmp"

func historyBinary(s Spec) string { return "compass images: " + s.Entrypoint() }

// checkBinary refuses a binary the image could not run or that would report
// another build than the labels say: not a static Linux ELF for the arch, not
// built with CGO_ENABLED=0 and -trimpath, or not linked with the spec's
// version and revision (-ldflags -X, which buildinfo.Read reads first). The
// build info does not record -ldflags under -trimpath, so the linked values
// are read from the variables themselves, through the symbol table: the
// binaries are linked with -w (no DWARF) but not -s.
func checkBinary(s Spec, bin []byte) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("binary is not an ELF file: %w", err)
	}
	defer f.Close()
	wantMachine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[s.Arch]
	if f.Machine != wantMachine || f.Class != elf.ELFCLASS64 {
		return fmt.Errorf("binary is for %s (%s), not %s (%s)", f.Machine, f.Class, wantMachine, s.Arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("binary is dynamically linked (it names an ELF interpreter); the image has no libc: build with CGO_ENABLED=0")
		}
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("binary has no Go build info: %w", err)
	}
	settings := map[string]string{}
	for _, kv := range bi.Settings {
		settings[kv.Key] = kv.Value
	}
	var errs []error
	for _, k := range []string{"GOOS", "GOARCH", "CGO_ENABLED", "-trimpath"} {
		want := map[string]string{"GOOS": imageOS, "GOARCH": s.Arch, "CGO_ENABLED": "0", "-trimpath": "true"}[k]
		if got := settings[k]; got != want {
			errs = append(errs, fmt.Errorf("binary was built with %s=%q, not %q", k, got, want))
		}
	}
	for _, v := range []struct{ name, want string }{{"version", s.Version}, {"revision", s.Revision}} {
		sym := buildinfoPackage + "." + v.name
		got, err := linkedString(f, sym)
		switch {
		case err != nil:
			errs = append(errs, err)
		case got != v.want:
			errs = append(errs, fmt.Errorf("binary's linked %s (-X %s) is %q, not %q", v.name, sym, got, v.want))
		}
	}
	return errors.Join(errs...)
}

// maxLinked bounds a linked string read from a binary; a version or a
// revision is far shorter.
const maxLinked = 256

// linkedString reads the value of the Go string variable sym of a 64-bit
// ELF binary: its symbol locates the string header (data pointer, length),
// and the pointer the bytes, each in the section holding that address.
func linkedString(f *elf.File, sym string) (string, error) {
	syms, err := f.Symbols()
	if err != nil {
		return "", fmt.Errorf("binary has no symbol table (linked with -s?), so %s cannot be read: %w", sym, err)
	}
	i := slices.IndexFunc(syms, func(s elf.Symbol) bool { return s.Name == sym })
	if i < 0 {
		return "", fmt.Errorf("binary has no symbol %s: not a Compass binary", sym)
	}
	hdr, err := readAt(f, syms[i].Value, 16)
	if err != nil {
		return "", fmt.Errorf("binary symbol %s: %w", sym, err)
	}
	ptr, n := f.ByteOrder.Uint64(hdr), f.ByteOrder.Uint64(hdr[8:])
	if n == 0 {
		return "", nil
	}
	if n > maxLinked {
		return "", fmt.Errorf("binary symbol %s is %d bytes long, over %d", sym, n, maxLinked)
	}
	b, err := readAt(f, ptr, n)
	if err != nil {
		return "", fmt.Errorf("binary symbol %s: its string: %w", sym, err)
	}
	return string(b), nil
}

// readAt reads n bytes at virtual address addr from the section holding it.
func readAt(f *elf.File, addr, n uint64) ([]byte, error) {
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_NOBITS || sec.Addr == 0 || addr < sec.Addr || addr-sec.Addr+n > sec.Size {
			continue
		}
		b := make([]byte, n)
		if _, err := sec.ReadAt(b, int64(addr-sec.Addr)); err != nil {
			return nil, fmt.Errorf("section %s: %w", sec.Name, err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("no section holds %d bytes at %#x", n, addr)
}

// readBinary reads the binary at p, refusing anything but a regular file of
// at most maxBinary bytes.
func readBinary(p string) ([]byte, error) { return readFileMax("binary", p, maxBinary) }

// readFileMax reads the regular file at p, refusing anything else and a
// file of more than limit bytes (checked before and while reading); what
// names the file in errors.
func readFileMax(what, p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file", what, p)
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s %s is %d bytes, over the %d-byte limit", what, p, fi.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s %s grew past the %d-byte limit while read", what, p, limit)
	}
	return b, nil
}

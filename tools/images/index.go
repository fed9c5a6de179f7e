package main

// The multi-platform image of one program: an OCI image index over the
// per-arch images that build makes, and for each of them a CycloneDX SBOM
// attached as an OCI 1.1 artifact whose subject is that image, so a registry
// with the referrers API lists it beside the image (`oras discover`,
// `crane ls`), and a layout carries it in its index.json.

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

const (
	// sbomType is the SBOM artifact's artifactType and its one layer's
	// media type (CycloneDX's registered JSON type).
	sbomType types.MediaType = "application/vnd.cyclonedx+json"
	// emptyConfigType is the OCI 1.1 empty descriptor an artifact with no
	// config of its own uses.
	emptyConfigType types.MediaType = "application/vnd.oci.empty.v1+json"
	// mainModule is what every SBOM's main component must be.
	mainModule = "github.com/compass-runner/identity"
	// maxSBOM bounds an SBOM read into memory; the daemons' are about 30 KiB.
	maxSBOM = 8 << 20
)

// emptyJSON is the content of the empty config descriptor.
var emptyJSON = []byte("{}")

// PlatformImage is one arch's image and the SBOM of its binary.
type PlatformImage struct {
	Arch  string
	Image v1.Image
	SBOM  []byte
}

// sbomArtifact is an SBOM as an OCI artifact manifest: an empty config, the
// SBOM as its only layer, and the image it describes as its subject.
type sbomArtifact struct {
	manifest []byte
	sbom     []byte
}

func (a sbomArtifact) RawConfigFile() ([]byte, error)      { return emptyJSON, nil }
func (a sbomArtifact) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (a sbomArtifact) RawManifest() ([]byte, error)        { return a.manifest, nil }
func (a sbomArtifact) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, b := range []struct {
		data []byte
		mt   types.MediaType
	}{{a.sbom, sbomType}, {emptyJSON, emptyConfigType}} {
		if sha256Hash(b.data) == h {
			return static.NewLayer(b.data, b.mt), nil
		}
	}
	return nil, fmt.Errorf("sbom artifact has no blob %s", h)
}

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}
}

// newSBOMArtifact is the artifact of sbom, describing subject. Its manifest
// carries the SBOM's file name and the image's created time, so it is a pure
// function of its inputs like the image.
func newSBOMArtifact(s Spec, subject v1.Descriptor, sbom []byte) (v1.Image, error) {
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  string(sbomType),
		Config:        v1.Descriptor{MediaType: emptyConfigType, Size: int64(len(emptyJSON)), Digest: sha256Hash(emptyJSON), Data: emptyJSON},
		Layers: []v1.Descriptor{{
			MediaType:   sbomType,
			Size:        int64(len(sbom)),
			Digest:      sha256Hash(sbom),
			Annotations: map[string]string{labelTitle: sbomFile(s, subject.Platform.Architecture)},
		}},
		Subject:     &v1.Descriptor{MediaType: subject.MediaType, Size: subject.Size, Digest: subject.Digest},
		Annotations: map[string]string{labelCreated: s.Labels()[labelCreated]},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(sbomArtifact{manifest: raw, sbom: sbom})
}

// sbomFile names an SBOM: <program>-<version>-linux-<arch>.cdx.json.
func sbomFile(s Spec, arch string) string {
	return fmt.Sprintf("%s-%s-%s-%s.cdx.json", s.Name, s.Version, imageOS, arch)
}

// checkSBOM refuses an SBOM that is not CycloneDX JSON describing this
// program's module at this version, built for this arch. The SBOM is
// cyclonedx-gomod's reading of the binary's build info, so the check ties
// it to the binary: a swapped file names another arch or version.
func checkSBOM(s Spec, arch string, b []byte) error {
	var bom struct {
		BOMFormat    string `json:"bomFormat"`
		SerialNumber string `json:"serialNumber"`
		Metadata     struct {
			Timestamp string `json:"timestamp"`
			Component struct {
				Name    string `json:"name"`
				Version string `json:"version"`
				PURL    string `json:"purl"`
			} `json:"component"`
		} `json:"metadata"`
		Components []json.RawMessage `json:"components"`
	}
	if err := json.Unmarshal(b, &bom); err != nil {
		return fmt.Errorf("sbom for %s is not JSON: %w", arch, err)
	}
	c := bom.Metadata.Component
	var errs []error
	if bom.BOMFormat != "CycloneDX" {
		errs = append(errs, fmt.Errorf("sbom for %s: bomFormat is %q, not CycloneDX", arch, bom.BOMFormat))
	}
	if c.Name != mainModule || c.Version != s.Version {
		errs = append(errs, fmt.Errorf("sbom for %s describes %s@%s, not %s@%s", arch, c.Name, c.Version, mainModule, s.Version))
	}
	if !strings.Contains(c.PURL, "goarch="+arch+"&") || !strings.HasSuffix(c.PURL, "#cmd/"+s.Name) {
		errs = append(errs, fmt.Errorf("sbom for %s: purl %q is not cmd/%s for goarch=%s", arch, c.PURL, s.Name, arch))
	}
	// A serial number or a timestamp would make two builds of one commit
	// differ (cyclonedx-gomod -noserial -notimestamp).
	if bom.SerialNumber != "" || bom.Metadata.Timestamp != "" {
		errs = append(errs, fmt.Errorf("sbom for %s has a serial number or timestamp; it must be reproducible", arch))
	}
	if len(bom.Components) == 0 {
		errs = append(errs, fmt.Errorf("sbom for %s lists no components", arch))
	}
	return errors.Join(errs...)
}

// BuildIndex is the image index of the platform images, named and annotated
// as s (whose Arch is ignored), and the SBOM artifacts, one per image, in
// the order of plats.
func BuildIndex(s Spec, plats []PlatformImage) (v1.ImageIndex, []v1.Image, error) {
	if len(plats) == 0 {
		return nil, nil, errors.New("index: no platform images")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var arts []v1.Image
	seen := map[string]bool{}
	for _, p := range plats {
		if seen[p.Arch] {
			return nil, nil, fmt.Errorf("index: two images for %s", p.Arch)
		}
		seen[p.Arch] = true
		ps := s
		ps.Arch = p.Arch
		if err := ps.Validate(); err != nil {
			return nil, nil, err
		}
		if err := checkSBOM(ps, p.Arch, p.SBOM); err != nil {
			return nil, nil, err
		}
		cf, err := p.Image.ConfigFile()
		if err != nil {
			return nil, nil, fmt.Errorf("index: %s image: %w", p.Arch, err)
		}
		if cf.Architecture != p.Arch || cf.OS != imageOS {
			return nil, nil, fmt.Errorf("index: the image given for %s is %s/%s", p.Arch, cf.OS, cf.Architecture)
		}
		m, err := p.Image.Manifest()
		if err != nil {
			return nil, nil, fmt.Errorf("index: %s image: %w", p.Arch, err)
		}
		if !reflect.DeepEqual(m.Annotations, ps.Labels()) {
			return nil, nil, fmt.Errorf("index: the %s image's annotations are %v, not %v", p.Arch, m.Annotations, ps.Labels())
		}
		desc, err := partial.Descriptor(p.Image)
		if err != nil {
			return nil, nil, fmt.Errorf("index: %s image: %w", p.Arch, err)
		}
		plat := ps.platform()
		desc.Platform = &plat
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: p.Image, Descriptor: v1.Descriptor{Platform: &plat}})
		art, err := newSBOMArtifact(ps, *desc, p.SBOM)
		if err != nil {
			return nil, nil, fmt.Errorf("index: %s sbom: %w", p.Arch, err)
		}
		arts = append(arts, art)
	}
	return mutate.Annotations(idx, s.Labels()).(v1.ImageIndex), arts, nil
}

// WriteIndexLayout writes idx, named s.Ref(), and the SBOM artifacts into a
// new OCI image layout at dir and returns the index's digest. As with
// WriteLayout, dir must not exist.
func WriteIndexLayout(dir string, s Spec, idx v1.ImageIndex, arts []v1.Image) (v1.Hash, error) {
	p, err := newLayout(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{annRefName: s.Ref()})); err != nil {
		return v1.Hash{}, fmt.Errorf("layout %s: %w", dir, err)
	}
	for _, a := range arts {
		if err := p.AppendImage(a); err != nil {
			return v1.Hash{}, fmt.Errorf("layout %s: sbom: %w", dir, err)
		}
	}
	return idx.Digest()
}

// readSingleImage is the one image of a layout build wrote.
func readSingleImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("layout %s: index: %w", dir, err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].MediaType != types.OCIManifestSchema1 {
		return nil, fmt.Errorf("layout %s: not a layout of one image (as images build writes)", dir)
	}
	return idx.Image(im.Manifests[0].Digest)
}

// IndexReport is what CheckIndex found, for printing.
type IndexReport struct {
	Ref      string
	Digest   v1.Hash
	Images   map[string]v1.Hash // arch → image manifest digest
	SBOMs    map[string]v1.Hash // arch → SBOM artifact digest
	SBOMSize map[string]int
	SBOMData map[string][]byte // arch → the SBOM
}

// CheckIndex reads the multi-platform layout at dir back and checks that it
// holds exactly: one image index named s.Ref() with s's annotations and one
// image per arch in arches (each equal to images[arch], the per-arch
// layout's image, when given, and each valid), and for each image one SBOM
// artifact whose subject is that image and whose SBOM passes checkSBOM.
func CheckIndex(dir string, s Spec, arches []string, images map[string]v1.Image) (IndexReport, error) {
	rep := IndexReport{Ref: s.Ref(), Images: map[string]v1.Hash{}, SBOMs: map[string]v1.Hash{}, SBOMSize: map[string]int{}, SBOMData: map[string][]byte{}}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return rep, fmt.Errorf("layout %s: %w", dir, err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return rep, fmt.Errorf("layout %s: index: %w", dir, err)
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	var indexes, artifacts []v1.Descriptor
	for _, d := range tm.Manifests {
		switch {
		case d.MediaType == types.OCIImageIndex:
			indexes = append(indexes, d)
		case d.MediaType == types.OCIManifestSchema1 && d.ArtifactType == string(sbomType):
			artifacts = append(artifacts, d)
		default:
			bad("layout entry %s (%s, artifactType %q) is neither the image index nor an SBOM", d.Digest, d.MediaType, d.ArtifactType)
		}
	}
	if len(indexes) != 1 {
		return rep, errors.Join(append(errs, fmt.Errorf("layout %s has %d image indexes, not 1", dir, len(indexes)))...)
	}
	rep.Digest = indexes[0].Digest
	if !reflect.DeepEqual(indexes[0].Annotations, map[string]string{annRefName: s.Ref()}) {
		bad("index entry annotations are %v, not %s=%s", indexes[0].Annotations, annRefName, s.Ref())
	}
	idx, err := top.ImageIndex(indexes[0].Digest)
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	if err := validate.Index(idx); err != nil {
		return rep, errors.Join(append(errs, fmt.Errorf("index %s does not validate: %w", rep.Digest, err))...)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	if !reflect.DeepEqual(im.Annotations, s.Labels()) {
		bad("index annotations are %v, not %v", im.Annotations, s.Labels())
	}
	var got []string
	byDigest := map[v1.Hash]string{}
	for _, d := range im.Manifests {
		if d.Platform == nil {
			bad("index entry %s has no platform", d.Digest)
			continue
		}
		arch := d.Platform.Architecture
		ps := s
		ps.Arch = arch
		if _, ok := archs[arch]; !ok || !d.Platform.Equals(ps.platform()) {
			bad("index entry %s has platform %v", d.Digest, d.Platform)
			continue
		}
		got = append(got, arch)
		rep.Images[arch] = d.Digest
		byDigest[d.Digest] = arch
		if want, ok := images[arch]; ok {
			wd, err := want.Digest()
			if err != nil || wd != d.Digest {
				bad("the %s image is %s, not the per-arch build's %s", arch, d.Digest, wd)
			}
		}
	}
	if !slices.Equal(got, arches) {
		bad("the index's platforms are %v, not %v", got, arches)
	}
	for _, d := range artifacts {
		art, err := top.Image(d.Digest)
		if err != nil {
			bad("sbom %s: %w", d.Digest, err)
			continue
		}
		m, err := art.Manifest()
		if err != nil {
			bad("sbom %s: %w", d.Digest, err)
			continue
		}
		if m.Subject == nil || byDigest[m.Subject.Digest] == "" {
			bad("sbom %s has no subject among the index's images", d.Digest)
			continue
		}
		arch := byDigest[m.Subject.Digest]
		if _, dup := rep.SBOMs[arch]; dup {
			bad("two SBOMs for the %s image", arch)
			continue
		}
		if m.Config.MediaType != emptyConfigType || len(m.Layers) != 1 || m.Layers[0].MediaType != sbomType {
			bad("sbom %s is not an empty-config artifact with one %s layer", d.Digest, sbomType)
			continue
		}
		ls, err := art.Layers()
		if err != nil || len(ls) != 1 {
			bad("sbom %s: layers: %v", d.Digest, err)
			continue
		}
		rc, err := ls[0].Compressed()
		if err != nil {
			bad("sbom %s: %w", d.Digest, err)
			continue
		}
		var buf bytes.Buffer
		_, err = buf.ReadFrom(io.LimitReader(rc, maxSBOM+1))
		_ = rc.Close()
		if err == nil && buf.Len() > maxSBOM {
			err = fmt.Errorf("larger than %d bytes", maxSBOM)
		}
		if err != nil {
			bad("sbom %s: %w", d.Digest, err)
			continue
		}
		if sha256Hash(buf.Bytes()) != m.Layers[0].Digest {
			bad("sbom %s: its blob does not match its digest", d.Digest)
			continue
		}
		ps := s
		ps.Arch = arch
		if err := checkSBOM(ps, arch, buf.Bytes()); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.SBOMs[arch], rep.SBOMSize[arch], rep.SBOMData[arch] = d.Digest, buf.Len(), buf.Bytes()
	}
	for _, a := range arches {
		if _, ok := rep.SBOMs[a]; !ok {
			bad("no SBOM for the %s image", a)
		}
	}
	return rep, errors.Join(errs...)
}

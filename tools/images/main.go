// Command images assembles the Compass OCI images (compass-server,
// compass-callout, compass-runner) from binaries built beforehand, and checks
// them. .ci/images builds the binaries and runs it; docs/images.md says what
// an image holds and how to verify and push one.
//
// Usage:
//
//	images build --binary FILE --out DIR --name NAME --version V --revision SHA [flags]
//	images check --layout DIR [--extract FILE] --name NAME --version V --revision SHA [flags]
//	images index --out DIR --image ARCH=LAYOUT --sbom ARCH=FILE ... --name NAME --version V --revision SHA [flags]
//	images check-index --layout DIR [--arches amd64,arm64] [--image ARCH=LAYOUT ...] --name NAME --version V --revision SHA [flags]
//	images push --layout DIR --to REGISTRY/REPOSITORY:TAG [--insecure]
//	images registry [--listen 127.0.0.1:0] [--addr-file FILE]
//	images chart-pin --chart DIR --images-env FILE --version V [--values-out FILE]
//	images chart-check [--chart TGZ] [--values FILE] --images-env FILE --version V
//	images chart-nats --values FILE [--registry HOST]
//	images digest --ref REGISTRY/REPOSITORY:TAG [--insecure]
//
// build writes a new OCI image layout at DIR holding one image and prints
// "<name> <reference> <manifest digest>". check reads such a layout back,
// compares everything in it with what build makes of the same flags, prints
// what it found and, with --extract, writes the image's binary to FILE. The
// image is a pure function of the flags and the binary's bytes: the same
// inputs give the same digest.
//
// index joins the per-arch layouts build wrote into one multi-platform
// layout: an OCI image index named <repository>/<name>:<version> and, for
// each image, its CycloneDX SBOM as an artifact whose subject is the image.
// check-index reads such a layout back. push copies it to a registry (the
// index under the tag, each SBOM by digest, so the referrers API lists it),
// with the credentials crane and docker keep; the pushed index has the
// layout's digest. registry serves an in-memory registry on loopback until
// SIGTERM, for the release procedure's dry run.
//
// chart-pin rewrites an unpacked copy of the Compass chart so that each
// Compass image is the one images.env pins (registry, repository, the
// version as tag, the digest) and the NATS image has images.env's digest
// (its registry, repository and tag the chart's, which NATS_IMAGE must
// name), after checking that Chart.yaml's version and appVersion are the
// release's; with --values-out it also writes those image values alone
// (values-images.yaml). chart-check reads a packaged chart, or such a
// values file, back and checks the same.
//
// digest prints the digest a registry serves for a reference (the image
// index's or manifest's): how the release pins an image it does not build.
// chart-nats prints the chart's NATS image as it renders without a digest
// (images.env's NATS_IMAGE before the @) and the reference the release
// reads its digest at: Docker Hub's, or the same path on --registry (the
// dry run's loopback registry).
//
// --source-date-epoch defaults to $SOURCE_DATE_EPOCH. Exit status: 0 when
// done, 1 when building or checking fails, 2 on a usage error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

const (
	defaultSource     = "https://github.com/compass-runner/identity"
	defaultRepository = "ghcr.io/compass-runner"
)

// errUsage marks an error that exits 2.
var errUsage = errors.New("usage")

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }
func (e usageError) Is(t error) bool {
	return t == errUsage
}

// specFlags registers the flags that describe an image on fs.
func specFlags(fs *flag.FlagSet) func() (Spec, error) {
	var s Spec
	fs.StringVar(&s.Name, "name", "", "program name: the binary's name in "+binDir+" and the image title (required)")
	fs.StringVar(&s.Version, "version", "", "version the binary reports and the image's tag, e.g. v0.1.0 (required)")
	fs.StringVar(&s.Revision, "revision", "", "full commit the binary was built from (required)")
	fs.StringVar(&s.Source, "source", defaultSource, "source repository URL (label org.opencontainers.image.source)")
	fs.StringVar(&s.Licenses, "licenses", "", "SPDX license expression (label org.opencontainers.image.licenses; none when empty)")
	fs.StringVar(&s.Repository, "repository", defaultRepository, "registry and namespace the image is named in")
	fs.StringVar(&s.Arch, "arch", "amd64", "GOARCH of the binary: amd64 or arm64")
	epoch := fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "Unix time of every timestamp in the image: the commit time (default $SOURCE_DATE_EPOCH)")
	return func() (Spec, error) {
		if *epoch == "" {
			return s, usageError{"--source-date-epoch (or SOURCE_DATE_EPOCH) is required"}
		}
		sec, err := strconv.ParseInt(*epoch, 10, 64)
		if err != nil {
			return s, usageError{fmt.Sprintf("--source-date-epoch %q is not a whole number of seconds", *epoch)}
		}
		if sec < 0 || sec > maxEpoch {
			return s, usageError{fmt.Sprintf("--source-date-epoch %d is not from 0 to %d (year 9999)", sec, maxEpoch)}
		}
		s.Created = time.Unix(sec, 0).UTC()
		if err := s.Validate(); err != nil {
			return s, usageError{err.Error()}
		}
		return s, nil
	}
}

func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fmt.Fprintf(stdout, "Usage of images %s:\n", fs.Name())
		fs.PrintDefaults()
		return flag.ErrHelp
	}
	if err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() != 0 {
		return usageError{fmt.Sprintf("unexpected arguments %q", fs.Args())}
	}
	return nil
}

func runBuild(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	binary := fs.String("binary", "", "the static Linux binary to put in the image (required)")
	out := fs.String("out", "", "directory of the new OCI image layout; must not exist (required)")
	spec := specFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *binary == "" || *out == "" {
		return usageError{"--binary and --out are required"}
	}
	s, err := spec()
	if err != nil {
		return err
	}
	bin, err := readBinary(*binary)
	if err != nil {
		return err
	}
	img, err := Build(s, bin)
	if err != nil {
		return err
	}
	d, err := WriteLayout(*out, s, img)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s %s\n", s.Name, s.Ref(), d)
	return nil
}

func runCheck(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	dir := fs.String("layout", "", "the OCI image layout to check (required)")
	extract := fs.String("extract", "", "write the image's binary to this file when the image checks out")
	spec := specFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *dir == "" {
		return usageError{"--layout is required"}
	}
	s, err := spec()
	if err != nil {
		return err
	}
	rep, err := Check(*dir, s, *extract)
	if err != nil {
		return fmt.Errorf("check %s (%s):\n  %s", *dir, s.Ref(), strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	printReport(stdout, rep)
	return nil
}

func printReport(w io.Writer, r Report) {
	fmt.Fprintf(w, "%s %s\n", r.Ref, r.Digest)
	fmt.Fprintf(w, "  user %s, entrypoint %q, no shell (the entrypoint is the only executable)\n", r.User, r.Entrypoint)
	for _, k := range []string{labelTitle, labelVersion, labelRevision, labelSource, labelCreated, labelLicenses} {
		if v, ok := r.Labels[k]; ok {
			fmt.Fprintf(w, "  label %s=%s\n", k, v)
		}
	}
	for i, l := range r.Layers {
		fmt.Fprintf(w, "  layer %d %s %d bytes, %d entries\n", i+1, l.Digest, l.Size, l.Entries)
	}
	fmt.Fprintf(w, "  CA bundle %s: %d roots; binary %d bytes, sha256 %s\n", caFile, r.Roots, r.BinarySize, r.BinarySum)
}

// archFiles is a repeated ARCH=PATH flag.
type archFiles struct {
	order []string
	paths map[string]string
}

func (a *archFiles) String() string {
	var parts []string
	for _, k := range a.order {
		parts = append(parts, k+"="+a.paths[k])
	}
	return strings.Join(parts, ",")
}

func (a *archFiles) Set(v string) error {
	arch, p, ok := strings.Cut(v, "=")
	if _, known := archs[arch]; !ok || !known || p == "" {
		return fmt.Errorf("%q is not ARCH=PATH with ARCH amd64 or arm64", v)
	}
	if a.paths == nil {
		a.paths = map[string]string{}
	}
	if _, dup := a.paths[arch]; dup {
		return fmt.Errorf("%s is given twice", arch)
	}
	a.order = append(a.order, arch)
	a.paths[arch] = p
	return nil
}

func runIndex(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("index", flag.ContinueOnError)
	out := fs.String("out", "", "directory of the new multi-platform OCI layout; must not exist (required)")
	var images, sboms archFiles
	fs.Var(&images, "image", "ARCH=LAYOUT: a layout images build wrote for that arch (repeat: one per platform, in index order)")
	fs.Var(&sboms, "sbom", "ARCH=FILE: the CycloneDX JSON SBOM of that arch's binary (cyclonedx-gomod bin -json -noserial -notimestamp)")
	spec := specFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *out == "" || len(images.order) == 0 {
		return usageError{"--out and at least one --image are required"}
	}
	if !slices.Equal(images.order, sboms.order) {
		return usageError{fmt.Sprintf("--sbom must name the arches of --image, in the same order (%v, not %v)", images.order, sboms.order)}
	}
	s, err := spec()
	if err != nil {
		return err
	}
	var plats []PlatformImage
	for _, arch := range images.order {
		img, err := readSingleImage(images.paths[arch])
		if err != nil {
			return err
		}
		sbom, err := readFileMax("sbom", sboms.paths[arch], maxSBOM)
		if err != nil {
			return err
		}
		plats = append(plats, PlatformImage{Arch: arch, Image: img, SBOM: sbom})
	}
	idx, arts, err := BuildIndex(s, plats)
	if err != nil {
		return err
	}
	d, err := WriteIndexLayout(*out, s, idx, arts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s %s\n", s.Name, s.Ref(), d)
	return nil
}

func runCheckIndex(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("check-index", flag.ContinueOnError)
	dir := fs.String("layout", "", "the multi-platform OCI layout to check (required)")
	arches := fs.String("arches", "amd64,arm64", "the platforms the index must hold, in order")
	sbomOut := fs.String("sbom-out", "", "write each SBOM, once checked, into this directory as <name>-<version>-linux-<arch>.cdx.json")
	var images archFiles
	fs.Var(&images, "image", "ARCH=LAYOUT: the per-arch layout whose image the index must hold for ARCH (repeatable)")
	spec := specFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *dir == "" {
		return usageError{"--layout is required"}
	}
	s, err := spec()
	if err != nil {
		return err
	}
	want := map[string]v1.Image{}
	for _, arch := range images.order {
		if want[arch], err = readSingleImage(images.paths[arch]); err != nil {
			return err
		}
	}
	rep, err := CheckIndex(*dir, s, strings.Split(*arches, ","), want)
	if err != nil {
		return fmt.Errorf("check-index %s (%s):\n  %s", *dir, s.Ref(), strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	if *sbomOut != "" {
		for arch, b := range rep.SBOMData {
			if err := os.WriteFile(filepath.Join(*sbomOut, sbomFile(s, arch)), b, 0o644); err != nil {
				return fmt.Errorf("check-index: %w", err)
			}
		}
	}
	fmt.Fprintf(stdout, "%s %s (image index)\n", rep.Ref, rep.Digest)
	for _, a := range strings.Split(*arches, ",") {
		fmt.Fprintf(stdout, "  linux/%s image %s, sbom %s (%d bytes, CycloneDX, subject: the image)\n", a, rep.Images[a], rep.SBOMs[a], rep.SBOMSize[a])
	}
	return nil
}

func runPush(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	dir := fs.String("layout", "", "the multi-platform OCI layout to push, as images index wrote it (required)")
	to := fs.String("to", "", "the tag to push the index as, e.g. ghcr.io/compass-runner/compass-runner:v0.1.0 (required)")
	insecure := fs.Bool("insecure", false, "plain HTTP: only for a registry on this machine (a test, a dry run)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *dir == "" || *to == "" {
		return usageError{"--layout and --to are required"}
	}
	var nameOpts []name.Option
	if *insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	tag, err := name.NewTag(*to, append(nameOpts, name.StrictValidation)...)
	if err != nil {
		return usageError{fmt.Sprintf("--to %q: %v", *to, err)}
	}
	// Credentials as crane and docker keep them (crane auth login).
	d, err := Push(*dir, tag, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s\n", tag, d)
	return nil
}

const usage = `usage: images build|check|index|check-index|push|registry|chart-pin|chart-check|chart-nats|digest [flags]   (images <command> -h for its flags)`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "build":
		err = runBuild(args[1:], stdout)
	case "check":
		err = runCheck(args[1:], stdout)
	case "index":
		err = runIndex(args[1:], stdout)
	case "check-index":
		err = runCheckIndex(args[1:], stdout)
	case "push":
		err = runPush(args[1:], stdout)
	case "registry":
		err = runRegistry(args[1:], stdout)
	case "chart-pin":
		err = runChartPin(args[1:], stdout)
	case "chart-check":
		err = runChartCheck(args[1:], stdout)
	case "chart-nats":
		err = runChartNATS(args[1:], stdout)
	case "digest":
		err = runDigest(args[1:], stdout)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		err = usageError{fmt.Sprintf("unknown command %q", args[0])}
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "images: %v\n%s\n", err, usage)
		return 2
	default:
		fmt.Fprintf(stderr, "images: %v\n", err)
		return 1
	}
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

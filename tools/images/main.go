// Command images assembles the Compass OCI images (compass-server,
// compass-callout, compass-runner) from binaries built beforehand, and checks
// them. .ci/images builds the binaries and runs it; docs/images.md says what
// an image holds and how to verify and push one.
//
// Usage:
//
//	images build --binary FILE --out DIR --name NAME --version V --revision SHA [flags]
//	images check --layout DIR [--extract FILE] --name NAME --version V --revision SHA [flags]
//
// build writes a new OCI image layout at DIR holding one image and prints
// "<name> <reference> <manifest digest>". check reads such a layout back,
// compares everything in it with what build makes of the same flags, prints
// what it found and, with --extract, writes the image's binary to FILE. The
// image is a pure function of the flags and the binary's bytes: the same
// inputs give the same digest.
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
	"strconv"
	"strings"
	"time"
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

const usage = `usage: images build|check [flags]   (images <command> -h for its flags)`

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

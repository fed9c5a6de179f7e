// Command ociarchive writes a one-program OCI image as an image archive (a
// tar of an OCI image layout) that containerd imports: the node test tier's
// pause and nats-server images. The image holds the static binary at
// /usr/local/bin/<name>, an /etc/passwd and /etc/group naming the nonroot user
// (65532) and a writable /tmp; it runs as 65532 unless --user says otherwise.
// Every timestamp is --epoch, so the same binary gives the same digest.
//
// Usage: ociarchive --binary FILE --ref REF --out FILE [--user UID] [--epoch N]
//
//	[--busybox FILE --applets sh,cat,...]
//
// With --busybox the image also holds that static busybox at /bin/busybox and
// a link in /bin for each applet, and /bin is on PATH: the nats-server image's
// reloader is a shell script, as in the official nats image.
//
// It prints the manifest digest.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"strings"
	"time"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

type blob struct {
	desc descriptor
	data []byte
}

func newBlob(mediaType string, data []byte) blob {
	return blob{descriptor{MediaType: mediaType, Digest: fmt.Sprintf("sha256:%x", sha256.Sum256(data)), Size: int64(len(data))}, data}
}

func main() {
	bin := flag.String("binary", "", "static binary the image runs (required)")
	ref := flag.String("ref", "", "image reference the archive names, e.g. compass.test/pause:v1 (required)")
	out := flag.String("out", "", "archive to write (required)")
	user := flag.String("user", "65532:65532", "user the image runs as")
	epoch := flag.Int64("epoch", 0, "Unix time of every timestamp in the image")
	busybox := flag.String("busybox", "", "static busybox to add at /bin/busybox")
	applets := flag.String("applets", "sh", "comma-separated busybox applets to link in /bin")
	flag.Parse()
	if *bin == "" || *ref == "" || *out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	var extra []file
	path := "/usr/local/bin"
	if *busybox != "" {
		bb, err := os.ReadFile(*busybox)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ociarchive:", err)
			os.Exit(1)
		}
		extra = append(extra, file{name: "bin/", mode: 0o755}, file{name: "bin/busybox", mode: 0o555, data: bb})
		for _, a := range strings.Split(*applets, ",") {
			extra = append(extra, file{name: "bin/" + a, mode: 0o777, link: "busybox"})
		}
		path += ":/bin"
	}
	digest, err := write(*bin, *ref, *out, *user, path, extra, time.Unix(*epoch, 0).UTC())
	if err != nil {
		fmt.Fprintln(os.Stderr, "ociarchive:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}

// file is a layer entry: a directory (name ends in /), a file or a symlink.
type file struct {
	name string
	mode int64
	data []byte
	link string
}

func write(binPath, ref, out, user, envPath string, extra []file, mtime time.Time) (string, error) {
	bin, err := os.ReadFile(binPath)
	if err != nil {
		return "", err
	}
	name := path.Base(binPath)
	entry := "/usr/local/bin/" + name

	// The layer: a deterministic tar (fixed times, owners and order), gzipped
	// with no name or time in its header.
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	files := append([]file{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: "usr/local/", mode: 0o755},
		{name: "usr/local/bin/", mode: 0o755},
		{name: entry[1:], mode: 0o555, data: bin},
	}, extra...)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: mtime, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		switch {
		case f.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.link, 0
		case strings.HasSuffix(f.name, "/"):
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := zw.Write(layerTar.Bytes()); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	layer := newBlob("application/vnd.oci.image.layer.v1.tar+gzip", gz.Bytes())
	diffID := fmt.Sprintf("sha256:%x", sha256.Sum256(layerTar.Bytes()))

	cfg, err := json.Marshal(map[string]any{
		"created":      mtime.Format(time.RFC3339),
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"User":       user,
			"Entrypoint": []string{entry},
			"Env":        []string{"PATH=" + envPath},
			"WorkingDir": "/",
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history": []map[string]any{{"created": mtime.Format(time.RFC3339), "created_by": "ociarchive: " + entry}},
	})
	if err != nil {
		return "", err
	}
	config := newBlob("application/vnd.oci.image.config.v1+json", cfg)
	man, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        config.desc,
		"layers":        []descriptor{layer.desc},
	})
	if err != nil {
		return "", err
	}
	manifest := newBlob("application/vnd.oci.image.manifest.v1+json", man)
	md := manifest.desc
	md.Annotations = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}
	md.Platform = map[string]string{"architecture": "amd64", "os": "linux"}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []descriptor{md}})
	if err != nil {
		return "", err
	}

	f, err := os.Create(out + ".tmp")
	if err != nil {
		return "", err
	}
	aw := tar.NewWriter(f)
	add := func(name string, data []byte) error {
		if err := aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := aw.Write(data)
		return err
	}
	err = add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	for _, b := range []blob{layer, config, manifest} {
		if err == nil {
			err = add("blobs/sha256/"+b.desc.Digest[len("sha256:"):], b.data)
		}
	}
	if err == nil {
		err = add("index.json", index)
	}
	err = errors.Join(err, aw.Close(), f.Close())
	if err != nil {
		os.Remove(out + ".tmp")
		return "", err
	}
	return manifest.desc.Digest, os.Rename(out+".tmp", out)
}

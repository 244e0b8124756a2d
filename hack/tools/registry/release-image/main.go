// release-image: what `make release` pushes, made reproducible. It reads the images
// `docker save` wrote (one per platform), sets every timestamp in them (the config's, the
// history's, each file's in each layer) to one time, the commit's, and writes them as an
// OCI image layout: the image itself, or, given several, an index of them by platform.
// It prints the digest of what it wrote: two builds of one commit print the same digest,
// so that a release can compare it with what a tag already holds.
//
//	release-image -epoch SECONDS -out DIR IMAGE.tar...
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	epoch := flag.Int64("epoch", -1, "the time every timestamp is set to, in Unix seconds (the commit's)")
	out := flag.String("out", "", "the OCI image layout to write (a new directory)")
	flag.Parse()
	if *epoch < 0 || *out == "" || flag.NArg() == 0 {
		log.Fatal("usage: release-image -epoch SECONDS -out DIR IMAGE.tar...")
	}
	at := time.Unix(*epoch, 0).UTC()
	var images []v1.Image
	for _, path := range flag.Args() {
		image, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			log.Fatalf("release-image: %s: %v", path, err)
		}
		// Layers as OCI media types, gzip-compressed by Go's deterministic writer.
		image, err = mutate.Time(image, at, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			log.Fatalf("release-image: %s: %v", path, err)
		}
		image = mutate.MediaType(mutate.ConfigMediaType(image, types.OCIConfigJSON), types.OCIManifestSchema1)
		images = append(images, image)
	}
	if err := os.RemoveAll(*out); err != nil {
		log.Fatal(err)
	}
	written, err := layout.Write(*out, empty.Index)
	if err != nil {
		log.Fatal(err)
	}
	var digest v1.Hash
	if len(images) == 1 {
		if err := written.AppendImage(images[0]); err != nil {
			log.Fatalf("release-image: %v", err)
		}
		if digest, err = images[0].Digest(); err != nil {
			log.Fatal(err)
		}
	} else {
		index := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for _, image := range images {
			config, err := image.ConfigFile()
			if err != nil {
				log.Fatal(err)
			}
			platform := config.Platform()
			index = mutate.AppendManifests(index, mutate.IndexAddendum{
				Add:        image,
				Descriptor: v1.Descriptor{Platform: platform},
			})
		}
		if err := written.AppendIndex(index); err != nil {
			log.Fatalf("release-image: %v", err)
		}
		if digest, err = index.Digest(); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(digest)
}

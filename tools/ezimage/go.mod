// ezimage: a build tool that writes reproducible OCI image tarballs without
// a container engine. Its own module so the agent's go.mod stays free of
// go-containerregistry.
module github.com/eztunnel/eztunnel/tools/ezimage

go 1.25.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.22.0 // indirect
)

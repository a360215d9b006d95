// A Go app that asks Cerbos through the Cerbos Go SDK (go get github.com/cerbos/cerbos-sdk-go), reading only the
// variables the injector sets. The same binary runs unchanged in sidecar and daemonset mode.
package main

import (
	"context"
	"log"
	"os"

	"github.com/cerbos/cerbos-sdk-go/cerbos"
)

func main() {
	// host:port in every mode: 127.0.0.1:3593 (sidecar) or <node IP>:3593 (daemonset); gRPC, cleartext.
	addr := os.Getenv("CERBOS_PDP_ADDR")
	// Daemonset mode in a privileged namespace also mounts the node's socket: same gRPC API, no TCP hop.
	if sock := os.Getenv("CERBOS_PDP_SOCKET"); sock != "" {
		addr = "unix:" + sock
	}
	c, err := cerbos.New(addr, cerbos.WithPlaintext())
	if err != nil {
		log.Fatalf("cerbos client for %s: %v", addr, err)
	}
	allowed, err := c.IsAllowed(context.Background(),
		cerbos.NewPrincipal("alice").WithRoles("user"),
		cerbos.NewResource("document", "1"),
		"view")
	if err != nil {
		log.Fatalf("check at %s: %v", addr, err)
	}
	log.Printf("alice may view document 1: %t", allowed)
}

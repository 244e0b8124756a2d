// A registry for the shipped suite, as production nodes meet one: go-containerregistry's
// registry behind TLS and HTTP basic authentication, so that the node pulls only with the
// chart's imagePullSecrets and trusts the registry's CA. Images live in memory.
package main

import (
	"crypto/subtle"
	"crypto/tls"
	"flag"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	address := flag.String("address", "127.0.0.1:5443", "host:port to listen on")
	certFile := flag.String("tls-cert", "", "PEM serving certificate")
	keyFile := flag.String("tls-key", "", "PEM key of the serving certificate")
	credentialsFile := flag.String("credentials", "", "a file holding user:password, which every request must carry")
	flag.Parse()
	credentials, err := os.ReadFile(*credentialsFile)
	if err != nil {
		log.Fatalf("registry: -credentials: %v", err)
	}
	user, password, ok := strings.Cut(strings.TrimSpace(string(credentials)), ":")
	if !ok || user == "" || password == "" || *certFile == "" || *keyFile == "" {
		log.Fatal("registry: -credentials (a user:password file), -tls-cert and -tls-key are required")
	}
	registryHandler := registry.New()
	authenticated := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 ||
			subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="cds-secret-guard tests"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		registryHandler.ServeHTTP(w, r)
	})
	server := &http.Server{
		Addr:              *address,
		Handler:           authenticated,
		ReadHeaderTimeout: 10 * time.Second,
		// HTTP/1.1 only: go-containerregistry's registry reads an upload's body under one
		// lock for all uploads, and HTTP/2's shared flow-control window then lets a
		// stream waiting for that lock starve the one holding it (concurrent pushes hang).
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	log.Printf("registry: serving https://%s", *address)
	log.Fatal(server.ListenAndServeTLS(*certFile, *keyFile))
}

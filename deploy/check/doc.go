// Package check renders the Helm chart (deploy/helm/outbox-cdc) and loads
// docker-compose.yml the way Helm and Docker do, and checks what comes out:
// every object decoded strictly into its Kubernetes type, the probes, the
// mounts, the security context, no secret in a ConfigMap, and the compose
// file's services, healthchecks and ordering. It is a module of its own so
// that Helm's, Kubernetes' and compose-go's dependencies stay out of the
// connector's go.mod; `make test` runs it. No cluster and no Docker engine
// are needed, and none is used.
package check

// Package testregistry is the tests' Confluent-compatible Schema Registry:
// the real one CDC_TEST_REGISTRY_URL names (make test-registry), or
// franz-go's srfake served over HTTP on a port of its own, so that the
// connector talks to it as to a real one.
//
// Its invariants: a real registry is shared by the whole run and outlives
// it, so each Registry names its subjects after a prefix unique to the test
// and takes the ids the registry gives; a registry that was asked for and
// does not answer fails the test, never skips it.
package testregistry

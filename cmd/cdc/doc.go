// Command cdc streams transactional-outbox rows from PostgreSQL logical
// replication into Kafka.
//
//	cdc run   --config cdc.yaml   stream until SIGINT/SIGTERM
//	cdc check --config cdc.yaml   validate the config, then check Postgres
//	                              and Kafka preconditions without streaming
//	cdc check --offline ...       validate the config only
//	cdc demo                      everything in one process, to see it work
//
// It parses flags, has internal/config read the file and the environment,
// and calls the packages under internal, which take typed configs. Exit codes: 0 after a clean
// shutdown, 1 on a fatal runtime error, 2 on a configuration error.
//
// On Linux it gives back the pages of its own binary that only starting
// touched, after the packages' inits and once each session streams
// (pages_linux.go): clean pages of the file, never a private copy, so the
// stream refaults what it runs and nothing else changes.
package main

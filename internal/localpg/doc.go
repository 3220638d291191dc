// Package localpg starts a throwaway PostgreSQL server with
// wal_level=logical from the machine's server binaries, for the integration
// tests and the demo. It is not used by the connector itself.
//
// The server runs from initdb and pg_ctl (found on PATH or in
// /usr/lib/postgresql/*/bin, version 15 or later) in a new temporary
// directory, listening on a free loopback port with trust authentication.
// As root it runs as the postgres (or nobody) user, because Postgres refuses
// to run as root. Durability settings are off: the data is thrown away.
package localpg

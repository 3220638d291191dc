// Package config is the connector's configuration: the Config a pipeline
// runs with, the rules that tie the stages' settings together (Validate),
// what a stage's settings are once the others are known (Producer,
// Registry), and Load, which reads it from the YAML file, the ${VAR}
// references in its values, and the CDC_<KEY> variables that override its
// keys (docs/config.md).
//
// Each stage's config (postgres.Config, sink.Config, ...) states its own
// keys (yaml tags), documents and applies its own defaults (its Validate,
// or an opt.Value's default where unset and zero differ), and the file is
// decoded straight into them; Load maps by hand only what the file keeps
// elsewhere than the Config does (tables, schema_registry, reconnect,
// http, log). Config's own fields state their defaults as named
// constants next to them. Validate never rewrites a stage's settings.
//
// Load refuses an unknown key with the nearest known one and a value of the
// wrong type with its line, and never shows a secret in an error; it also
// returns the process's logging and endpoint settings. Validate runs once,
// in pipeline.New; it fills the defaults into copies of the tables, never
// into the caller's (TestValidateLeavesCallersTablesAlone).
//
// Every key of the file is documented in docs/config.md, every key outside
// tables has an environment variable, and every field of the decoded types
// says its key or that it has none (TestEveryConfigKeyIsDocumented,
// TestEverySettingFromTheEnvironment, TestEveryFieldSaysItsKey).
package config

// Environ looks a variable up: os.LookupEnv, or a test's map. "Set to
// empty" and "unset" differ: CDC_HTTP_LISTEN= turns the endpoint off.
type Environ func(string) (string, bool)

// Get returns a variable's value, "" when unset.
func (e Environ) Get(key string) string {
	v, _ := e(key)
	return v
}

// Map is an environment of these key, value pairs, for the tests and for
// a caller that builds its environment itself.
func Map(kv ...string) Environ {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

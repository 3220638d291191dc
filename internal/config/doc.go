// Package config is the connector's configuration: the Config a pipeline
// runs with, its defaults and the rules that tie the stages' settings
// together (Validate), and Load, which reads it from the YAML file, the
// ${VAR} references in its values, and the CDC_<KEY> variables that
// override its keys (docs/config.md). Load refuses an unknown key with the
// nearest known one and a value of the wrong type with its line, and never
// shows a secret in an error; it also returns the process's logging and
// endpoint settings. Validate runs once, in pipeline.New; it fills the
// defaults into copies of the tables, never into the caller's
// (TestValidateLeavesCallersTablesAlone).
//
// Every key of the file is documented in docs/config.md, and every key
// outside tables has an environment variable (TestEveryConfigKeyIsDocumented,
// TestEverySettingFromTheEnvironment).
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

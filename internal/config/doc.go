// Package config reads the connector's configuration: the YAML file, the
// ${VAR} references in its values, and the CDC_<KEY> variables that override
// its keys (docs/config.md). It refuses an unknown key with the nearest
// known one, a value of the wrong type with its line, and never shows a
// secret in an error. It turns the file into the pipeline's Config and the
// process's logging and endpoint settings; the pipeline validates the
// result and applies the defaults, once, in pipeline.New.
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

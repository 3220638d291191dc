// Package secret reads the files that hold the connector's secrets
// (passwords, tokens, signing keys), one way for all of them: the file's
// bytes, without the line ending an editor or echo leaves at the end, are
// the secret; a file with nothing else is refused. Nothing else is trimmed,
// so a password that begins or ends with a space is kept as it is. Errors
// name the file, never its content. It imports nothing of the project.
package secret

import (
	"fmt"
	"os"
	"strings"
)

// Read returns the secret in the file at path.
func Read(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// Lines returns the non-empty lines of the file at path, each without
// surrounding white space: a list of keys, one a line.
func Lines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return lines, nil
}

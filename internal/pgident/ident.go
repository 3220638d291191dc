// Package pgident parses and quotes SQL identifiers the way PostgreSQL
// does: unquoted names fold to lower case, "Quoted" ones keep their case,
// and "" inside quotes is a literal quote. It is a leaf package, so that the
// stages that talk to Postgres (wal) and the domain types (outbox) share one
// set of rules without importing each other.
package pgident

import (
	"fmt"
	"strings"
)

// Qualified returns schema.name quoted for SQL, e.g. public.outbox or
// tenant."OutboxEvent".
func Qualified(schema, name string) string { return Quote(schema) + "." + Quote(name) }

// ParseQualified parses a name the way a user writes it in SQL: "outbox",
// "public.outbox", `tenant."OutboxEvent"`. Unquoted parts fold to lower
// case; the schema defaults to public.
func ParseQualified(s string) (schema, name string, err error) {
	parts, err := split(s)
	if err != nil {
		return "", "", fmt.Errorf("table name %q: %w", s, err)
	}
	switch len(parts) {
	case 1:
		return "public", parts[0], nil
	case 2:
		return parts[0], parts[1], nil
	default:
		return "", "", fmt.Errorf("table name %q: want table or schema.table", s)
	}
}

// Parse parses one identifier as written in SQL: unquoted folds to lower
// case, "Quoted" keeps its case.
func Parse(s string) (string, error) {
	parts, err := split(s)
	if err != nil {
		return "", fmt.Errorf("identifier %q: %w", s, err)
	}
	if len(parts) != 1 {
		return "", fmt.Errorf("identifier %q: want one name, not a dotted path", s)
	}
	return parts[0], nil
}

// Ident quotes an identifier for SQL, always: a plain lower-case name can still
// be a reserved word (user, order, select), which bare in a query means
// something else (user is the role's name). Every statement the connector
// builds names columns and tables with it (docs/design.md, "Untrusted input
// stays data").
func Ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// QualifiedIdent is schema.name for SQL, each part always quoted.
func QualifiedIdent(schema, name string) string { return Ident(schema) + "." + Ident(name) }

// Quote quotes an identifier for messages unless it is a plain lower-case
// name, so that they show names the way a user would type them. Statements
// use Ident.
//
// A keyword is quoted too, so that a name in a message can be pasted
// into SQL.
func Quote(s string) string {
	plain := s != ""
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r == '_' || (i > 0 && r >= '0' && r <= '9')) {
			plain = false
			break
		}
	}
	if plain && !reserved[s] {
		return s
	}
	return Ident(s)
}

// reserved are PostgreSQL's keywords that cannot stand bare as a column
// name (reserved, and reserved-but-allowed-as-function-or-type names).
var reserved = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`all analyse analyze and any array as asc asymmetric authorization binary both case cast check collate collation column
		concurrently constraint create cross current_catalog current_date current_role current_schema current_time current_timestamp current_user
		default deferrable desc distinct do else end except false fetch for foreign freeze from full grant group having ilike in initially inner
		intersect into is isnull join lateral leading left like limit localtime localtimestamp natural not notnull null offset on only or order
		outer overlaps placing primary references returning right select session_user similar some symmetric system_user table tablesample then
		to trailing true union unique user using variadic verbose when where window with`) {
		reserved[w] = true
	}
}

// split splits a dotted SQL identifier path, honouring double quotes
// ("" is an escaped quote inside a quoted identifier).
func split(s string) ([]string, error) {
	var parts []string
	s = strings.TrimSpace(s)
	for {
		if s == "" {
			return nil, fmt.Errorf("empty name")
		}
		var part string
		if s[0] == '"' {
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(s[i:], '"')
				if j < 0 {
					return nil, fmt.Errorf("unterminated quote")
				}
				b.WriteString(s[i : i+j])
				i += j + 1
				if i < len(s) && s[i] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			part, s = b.String(), s[i:]
			if part == "" {
				return nil, fmt.Errorf("empty quoted name")
			}
		} else {
			j := strings.IndexByte(s, '.')
			if j < 0 {
				j = len(s)
			}
			part, s = strings.ToLower(strings.TrimSpace(s[:j])), s[j:]
			if part == "" || strings.ContainsAny(part, `" `) {
				return nil, fmt.Errorf("invalid unquoted name %q", part)
			}
		}
		parts = append(parts, part)
		if s == "" {
			return parts, nil
		}
		if s[0] != '.' {
			return nil, fmt.Errorf("unexpected %q after name", s)
		}
		s = s[1:]
	}
}

// ParseList parses a comma-separated list of column names as written in
// SQL ("created_at, id", `"createdAt"`): each is folded or unquoted as
// Parse does. Anything else, such as a sort direction, is an error.
func ParseList(s string) ([]string, error) {
	var names []string
	for s = strings.TrimSpace(s); s != ""; {
		// Find the comma that ends this name, outside quotes.
		end, quoted := len(s), false
		for i := 0; i < len(s); i++ {
			if s[i] == '"' {
				quoted = !quoted
			} else if s[i] == ',' && !quoted {
				end = i
				break
			}
		}
		name, err := Parse(s[:end])
		if err != nil {
			return nil, fmt.Errorf("%w; list column names, separated by commas (ascending order only)", err)
		}
		names = append(names, name)
		if end == len(s) {
			break
		}
		if s = strings.TrimSpace(s[end+1:]); s == "" {
			return nil, fmt.Errorf("empty name after the last comma")
		}
	}
	return names, nil
}

package sqlwhere

import (
	"fmt"
	"strings"
)

// Check refuses a backfill condition that could change the
// statement it is placed in rather than filter its rows, or that calls a
// function with effects outside its read-only transaction. A condition
// comes from the config or from cdc backfill, and reaches a connection of a
// role that can read every table (docs/security.md): it runs in a
// read-only transaction, under backfill.statement_timeout, with a pinned
// search_path and, with backfill.reader_role, as a role that may only read
// the outbox tables; this check keeps it inside its WHERE.
//
// It reads the condition as PostgreSQL's lexer does (scan.l, with
// standard_conforming_strings on): string constants (”, E”, U&”,
// B”, X”, N”), quoted identifiers, dollar-quoted strings and
// parameters, so that a quote or parenthesis inside any of them is not
// taken for one outside, and one outside is never taken for one inside.
// Outside them it refuses a parenthesis closed that was not opened, one
// left open, a ';', a comment (-- or /*), and a call of a function of
// deniedFunctions.
func Check(where string) error {
	depth := 0
	// prev holds the tokens since the last one that is neither a name nor
	// a dot: a call's name, qualified or not, is its end.
	var prev []string
	for i := 0; i < len(where); {
		c := where[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
			continue
		case c == '-' && i+1 < len(where) && where[i+1] == '-', c == '/' && i+1 < len(where) && where[i+1] == '*':
			return fmt.Errorf("backfill condition %q contains a comment; remove it", where)
		case c == '\'':
			end, err := stringEnd(where, i, false)
			if err != nil {
				return err
			}
			i, prev = end, nil
			continue
		case c == '"':
			name, end, err := quotedIdent(where, i)
			if err != nil {
				return err
			}
			i, prev = end, append(prev, name)
			continue
		case c == '$':
			if tag, ok := dollarTag(where, i); ok {
				k := strings.Index(where[i+len(tag):], tag)
				if k < 0 {
					return fmt.Errorf("backfill condition %q: a dollar-quoted string is not closed", where)
				}
				i, prev = i+len(tag)+k+len(tag), nil
				continue
			}
			// A parameter, $1: digits follow.
			i++
			for i < len(where) && isDigit(where[i]) {
				i++
			}
			prev = nil
			continue
		case isIdentStart(c):
			end, name, isName, err := word(where, i)
			if err != nil {
				return err
			}
			if isName {
				i, prev = end, append(prev, name)
			} else {
				i, prev = end, nil // a string constant
			}
			continue
		case c == '(':
			if called(prev) {
				return fmt.Errorf("backfill condition %q calls %s, which acts outside its read-only transaction; write a condition on the table's columns", where, prev[len(prev)-1])
			}
			depth++
		case c == ')':
			if depth--; depth < 0 {
				return fmt.Errorf("backfill condition %q closes a parenthesis it did not open; write a condition, such as published_at IS NULL", where)
			}
		case c == ';':
			return fmt.Errorf("backfill condition %q contains ';'; write one condition, not statements", where)
		case c == '.' && !(i+1 < len(where) && isDigit(where[i+1])):
			// A qualified name: keep the qualifier before the dot.
			i, prev = i+1, append(prev, ".")
			continue
		}
		i, prev = i+1, nil
	}
	if depth != 0 {
		return fmt.Errorf("backfill condition %q leaves a parenthesis open", where)
	}
	return nil
}

// word reads the token that starts with an identifier's first character at
// where[i], and returns where it ends and, unless it is a string constant
// with a prefix, the name it is (lower-cased unless quoted).
func word(where string, i int) (end int, name string, isName bool, err error) {
	j := i + 1
	for j < len(where) && isIdentCont(where[j]) {
		j++
	}
	w := where[i:j]
	// A string constant's prefix is a token of its own: E'…' takes
	// backslash escapes; B'', X'', N'' and U&'' do not. An identifier
	// that merely ends in e, b, x or n does not prefix anything: its
	// quote starts a plain string.
	if j < len(where) && where[j] == '\'' && len(w) == 1 && strings.ContainsRune("eEbBxXnN", rune(w[0])) {
		end, err := stringEnd(where, j, w == "e" || w == "E")
		return end, "", false, err
	}
	if (w == "u" || w == "U") && j+1 < len(where) && where[j] == '&' && (where[j+1] == '\'' || where[j+1] == '"') {
		if where[j+1] == '"' {
			name, end, err := quotedIdent(where, j+1)
			return end, name, true, err
		}
		end, err := stringEnd(where, j+1, false)
		return end, "", false, err
	}
	return j, strings.ToLower(w), true, nil
}

// called reports whether the name that prev ends with, just before a '(',
// is one of deniedFunctions: bare, or qualified with pg_catalog.
func called(prev []string) bool {
	n := len(prev)
	if n == 0 || !deniedFunctions[prev[n-1]] {
		return false
	}
	if n == 1 || prev[n-2] != "." {
		return true // bare: found on any search_path, pinned to pg_catalog
	}
	return n >= 3 && prev[n-3] == "pg_catalog"
}

// stringEnd returns the index after the string constant whose opening
// quote is at where[i]: ” inside is a quote, and with escapes (E”) a
// backslash escapes the next byte.
func stringEnd(where string, i int, escapes bool) (int, error) {
	for i++; i < len(where); i++ {
		switch {
		case escapes && where[i] == '\\':
			i++
		case where[i] == '\'':
			if i+1 < len(where) && where[i+1] == '\'' {
				i++
				continue
			}
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("backfill condition %q: a string literal is not closed", where)
}

// quotedIdent returns the quoted identifier at where[i] and the index
// after it; "" inside is a quote.
func quotedIdent(where string, i int) (string, int, error) {
	var b strings.Builder
	for i++; i < len(where); i++ {
		if where[i] == '"' {
			if i+1 < len(where) && where[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			return b.String(), i + 1, nil
		}
		b.WriteByte(where[i])
	}
	return "", 0, fmt.Errorf("backfill condition %q: a quoted identifier is not closed", where)
}

// dollarTag returns the tag ($$ or $name$) of a dollar-quoted string that
// starts at where[i], if one does: a tag is an identifier without $ that
// does not start with a digit.
func dollarTag(where string, i int) (string, bool) {
	j := i + 1
	if j < len(where) && where[j] == '$' {
		return "$$", true
	}
	if j >= len(where) || !isIdentStart(where[j]) {
		return "", false
	}
	for j < len(where) && isIdentCont(where[j]) && where[j] != '$' {
		j++
	}
	if j < len(where) && where[j] == '$' {
		return where[i : j+1], true
	}
	return "", false
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c >= 0x80 || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentCont(c byte) bool  { return isIdentStart(c) || isDigit(c) || c == '$' }

// deniedFunctions act outside a read-only transaction, or wait: they end
// or signal other sessions, change or consume replication slots, write
// WAL, notify, change settings beyond the statement, sleep, take locks,
// or reach files and other servers. backfill.reader_role keeps them out
// where PostgreSQL's privileges can (docs/security.md); this list keeps a
// condition from naming them at all.
var deniedFunctions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`
		pg_terminate_backend pg_cancel_backend pg_signal_backend pg_reload_conf pg_rotate_logfile pg_promote
		pg_drop_replication_slot pg_create_logical_replication_slot pg_create_physical_replication_slot
		pg_copy_logical_replication_slot pg_copy_physical_replication_slot pg_replication_slot_advance
		pg_logical_slot_get_changes pg_logical_slot_get_binary_changes pg_logical_slot_peek_changes pg_logical_slot_peek_binary_changes
		pg_logical_emit_message pg_replication_origin_create pg_replication_origin_drop pg_replication_origin_advance
		pg_replication_origin_session_setup pg_switch_wal pg_create_restore_point pg_backup_start pg_backup_stop
		pg_start_backup pg_stop_backup pg_log_standby_snapshot pg_log_backend_memory_contexts pg_export_snapshot
		pg_notify set_config pg_sleep pg_sleep_for pg_sleep_until
		pg_advisory_lock pg_advisory_lock_shared pg_advisory_xact_lock pg_advisory_xact_lock_shared
		pg_try_advisory_lock pg_try_advisory_lock_shared pg_try_advisory_xact_lock pg_try_advisory_xact_lock_shared
		pg_advisory_unlock pg_advisory_unlock_shared pg_advisory_unlock_all
		pg_read_file pg_read_binary_file pg_ls_dir pg_ls_logdir pg_ls_waldir pg_ls_tmpdir pg_ls_archive_statusdir pg_stat_file
		lo_import lo_export lo_from_bytea lo_put lo_create lo_unlink lo_open lo_truncate lowrite loread
		dblink dblink_exec dblink_connect dblink_connect_u dblink_send_query dblink_open
		pg_stat_reset pg_stat_reset_shared pg_stat_reset_single_table_counters pg_stat_reset_slru pg_stat_reset_replication_slot
		pg_wal_replay_pause pg_wal_replay_resume pg_sync_replication_slots txid_current pg_current_xact_id nextval setval`) {
		deniedFunctions[f] = true
	}
}

package exprcost

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// A zone named in getHours("Europe/Paris") and its kin is read from the
// time-zone database, files: cel-go's accessors call time.LoadLocation at
// each call, with any name, which may be a file of it that is no zone
// (tzdata.zi, the whole database as text, read whole before it is found
// none). Ours, declared in place of cel-go's, load only a name shaped as
// the database names zones (zoneShaped), once (zones). A name with a ':'
// is an offset, "+02:00", which cel-go parses, reading nothing.

// inZone are the accessors that take a zone, by overload, and their
// function, whose accessor without a zone cel-go gives a time's own field.
var inZone = map[string]string{
	"timestamp_to_year_with_tz": overloads.TimeGetFullYear, "timestamp_to_month_with_tz": overloads.TimeGetMonth,
	"timestamp_to_day_of_year_with_tz": overloads.TimeGetDayOfYear, "timestamp_to_day_of_month_with_tz": overloads.TimeGetDayOfMonth,
	"timestamp_to_day_of_month_1_based_with_tz": overloads.TimeGetDate, "timestamp_to_day_of_week_with_tz": overloads.TimeGetDayOfWeek,
	"timestamp_to_hours_with_tz": overloads.TimeGetHours, "timestamp_to_minutes_with_tz": overloads.TimeGetMinutes,
	"timestamp_to_seconds_tz": overloads.TimeGetSeconds, "timestamp_to_milliseconds_with_tz": overloads.TimeGetMilliseconds,
}

// inZoneFunctions declare our accessors in place of cel-go's: the same
// overloads (cel-go takes a binding given again for an overload it has).
func inZoneFunctions() []cel.EnvOption {
	var opts []cel.EnvOption
	for id, function := range inZone {
		opts = append(opts, cel.Function(function, cel.MemberOverload(id, []*cel.Type{cel.TimestampType, cel.StringType}, cel.IntType,
			cel.BinaryBinding(func(ts, tz ref.Val) ref.Val {
				t, ok1 := ts.(types.Timestamp)
				name, ok2 := tz.(types.String)
				switch {
				case !ok1 || !ok2:
					return types.MaybeNoSuchOverloadErr(tz)
				case strings.Contains(string(name), ":"):
					return t.Receive(function, id, []ref.Val{tz}) // cel-go's
				}
				loc, err := zones.load(string(name))
				if err != nil {
					return types.NewErrFromString(err.Error())
				}
				return types.Timestamp{Time: t.In(loc)}.Receive(function, "", nil) // the field, in loc
			}))))
	}
	return opts
}

// zoneShaped reports whether name is shaped as the database names zones:
// at most 64 bytes, 3 parts between '/', each of ASCII letters, digits,
// '_', '-' and '+' from a letter (Europe/Paris, Etc/GMT+5, UTC); or empty
// (UTC). Not Local or localtime, the host's zone (its environment).
func zoneShaped(name string) bool {
	if name == "Local" || name == "localtime" || len(name) > 64 {
		return false
	}
	parts, start := 1, true
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		switch {
		case c == '/' && !start:
			parts, start = parts+1, true
			continue
		case start && !letter, !letter && !('0' <= c && c <= '9') && c != '_' && c != '-' && c != '+':
			return false
		}
		start = false
	}
	return parts <= 3 && (name == "" || !start)
}

// zones keeps what loading a zone gave, by name: at most 2048 zones (the
// database has fewer names) and 1024 names that are none, so that a row's
// made-up names neither grow it without bound nor push the zones out.
// Past either, a name is loaded at each call, which tzCost pays for.
var zones = zoneCache{kept: map[string]*time.Location{}}

type zoneCache struct {
	sync.RWMutex
	kept           map[string]*time.Location // nil: no zone
	found, missing int
}

// load is the zone name, if the database has it.
func (z *zoneCache) load(name string) (*time.Location, error) {
	if !zoneShaped(name) {
		return nil, fmt.Errorf("%.64q is no time zone's name: name one as the time-zone database does (Europe/Paris, UTC, Etc/GMT+5), or give an offset (+02:00)", name)
	}
	z.RLock()
	loc, ok := z.kept[name]
	z.RUnlock()
	if !ok {
		loc, _ = time.LoadLocation(name)
		z.Lock()
		switch _, kept := z.kept[name]; {
		case !kept && loc != nil && z.found < 2048:
			z.found++
			z.kept[name] = loc
		case !kept && loc == nil && z.missing < 1024:
			z.missing++
			z.kept[name] = nil
		}
		z.Unlock()
	}
	if loc == nil {
		return nil, fmt.Errorf("unknown time zone %s", name)
	}
	return loc, nil
}

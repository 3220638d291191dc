package expr

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// The values an expression reads, made once per event: an Activation's
// ResolveName returns them as they are, and a value read twice, or by two
// expressions, is not converted twice.

// Null is SQL NULL, and JSON's null.
var Null any = types.NullValue

// Text is a text value.
func Text(s string) any { return types.String(s) }

// Bytes is a bytea value, decoded.
func Bytes(b []byte) any { return types.Bytes(b) }

// Bool is a boolean value.
func Bool(b bool) any { return types.Bool(b) }

// Time is a timestamp.
func Time(t time.Time) any { return types.Timestamp{Time: t} }

// Number is the number s as JSON and Postgres write it: an int when it is
// an integer that fits 64 bits (an id of 2^53 and more keeps its digits,
// which a double would not), a double when it fits one (rounded, as JSON
// decoders do; Postgres' NaN and Infinity of a float or a numeric column
// are a double's own), and its text when it is not a number. A number too
// large for a double (1e999, a numeric of 400 digits) is neither: it is an
// error, which an expression that reads it fails on, as on a value of the
// wrong type, so that its event is invalid.
func Number(s string) any {
	v, err := number(s)
	if err != nil {
		return types.WrapErr(err)
	}
	return v
}

func number(s string) (ref.Val, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return types.Int(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err == nil:
		return types.Double(f), nil
	case errors.Is(err, strconv.ErrRange):
		if len(s) > 24 {
			s = fmt.Sprintf("%s... (%d characters)", s[:20], len(s))
		}
		return nil, fmt.Errorf("the number %s is too large for a double, and an expression reads numbers as 64-bit ints and doubles", s)
	}
	return types.String(s), nil
}

// Failed is a value that could not be read as its type: an expression
// that reads it fails with err.
func Failed(err error) any { return types.WrapErr(err) }

// Value is v, a Go value as Activation's ResolveName may give, converted
// to what an expression reads: a caller that gives the same value to
// several expressions converts it once, not at every read.
func Value(v any) any { return types.DefaultTypeAdapter.NativeToValue(v) }

// Object is a map whose keys are named in advance: a row's columns, or
// the members of a JSON object, that the expressions read, each by its
// name (Program.Row, Program.PayloadMembers). An expression reads it as a
// map of the members it holds. It is made once and filled for each event
// (Set, ReadJSON), so that reading an event makes no map; fill it again
// only once no evaluation of the last event's runs.
type Object struct {
	names []string
	vals  []ref.Val // nil: absent
}

var _ traits.Mapper = (*Object)(nil)

// NewObject is an Object of names, each absent.
func NewObject(names []string) *Object {
	return &Object{names: names, vals: make([]ref.Val, len(names))}
}

// Set makes member i (of the names NewObject was given) v, a value of
// this package's (Text, Number, Null...); nil makes it absent.
func (o *Object) Set(i int, v any) {
	if v == nil {
		o.vals[i] = nil
		return
	}
	o.vals[i] = v.(ref.Val)
}

// Find is the member named key.
func (o *Object) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		return types.MaybeNoSuchOverloadErr(key), false
	}
	for i, n := range o.names {
		if n == string(k) && o.vals[i] != nil {
			return o.vals[i], true
		}
	}
	return nil, false
}

// Get is the member named key, or an error.
func (o *Object) Get(key ref.Val) ref.Val {
	v, found := o.Find(key)
	if !found {
		return types.ValOrErr(v, "no such key: %v", key)
	}
	return v
}

// Contains reports whether o has the member named key.
func (o *Object) Contains(key ref.Val) ref.Val {
	v, found := o.Find(key)
	if !found && v != nil {
		return v
	}
	return types.Bool(found)
}

// Size is how many members o holds.
func (o *Object) Size() ref.Val {
	n := 0
	for _, v := range o.vals {
		if v != nil {
			n++
		}
	}
	return types.Int(n)
}

// The rest of a map's methods, which an expression that reads o by member
// name does not call, answer as the map of o's members would.

func (o *Object) asMap() traits.Mapper {
	m := map[ref.Val]ref.Val{}
	for i, v := range o.vals {
		if v != nil {
			m[types.String(o.names[i])] = v
		}
	}
	return types.NewRefValMap(types.DefaultTypeAdapter, m)
}

func (o *Object) Iterator() traits.Iterator { return o.asMap().Iterator() }

func (o *Object) ConvertToNative(t reflect.Type) (any, error) { return o.asMap().ConvertToNative(t) }

func (o *Object) ConvertToType(t ref.Type) ref.Val { return o.asMap().ConvertToType(t) }

func (o *Object) Equal(other ref.Val) ref.Val { return o.asMap().Equal(other) }

func (o *Object) Type() ref.Type { return types.MapType }

func (o *Object) Value() any { return o.asMap().Value() }

func (o *Object) String() string { return fmt.Sprint(o.asMap().Value()) }

// Package opt is a setting that may be left unset, so that its default
// applies, or set to any value, its zero included. A setting whose zero
// means something ("0 turns it off", "false") needs it: with a plain field
// unset and zero could not be told apart, and the zero would need a
// sentinel (-1 for off) that every reader must know.
//
// A Value decodes from YAML as its element would (the key present means
// set, null included means unset), and the config loader checks it as its
// element (Value.Elem).
package opt

import (
	"reflect"

	"go.yaml.in/yaml/v3"
)

// Value is a setting of type T that is set or not. The zero Value is
// unset.
type Value[T any] struct {
	v   T
	set bool
}

// Set is a Value set to v.
func Set[T any](v T) Value[T] { return Value[T]{v: v, set: true} }

// Or is the value when set, def otherwise: the one place a setting's
// default applies, next to the field it belongs to.
func (o Value[T]) Or(def T) T {
	if o.set {
		return o.v
	}
	return def
}

// IsSet reports whether the value was set.
func (o Value[T]) IsSet() bool { return o.set }

// UnmarshalYAML sets the value from a YAML node; null leaves it unset.
func (o *Value[T]) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		*o = Value[T]{}
		return nil
	}
	var v T
	if err := n.Decode(&v); err != nil {
		return err
	}
	*o = Set(v)
	return nil
}

// Elem is T's type, for the loader's checks of the file.
func (Value[T]) Elem() reflect.Type { return reflect.TypeFor[T]() }

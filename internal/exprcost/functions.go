package exprcost

import (
	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
)

// Functions declares, beside CEL's standard library (which cel.NewEnv
// declares whatever the options), the functions an expression may call and
// the cost models of those that need one: every overload of the
// environment is then one bounds lists. An environment given any function
// of its own besides these is not bounded by this package.
func Functions() []cel.EnvOption {
	opts := []cel.EnvOption{
		// lowerAscii, upperAscii, replace, split, join, substring, trim,
		// indexOf, format...: CEL's standard library has no case or
		// replacement, which topic names need. Pinned, so an upgrade of
		// cel-go adds no function unasked (and one that did would fail
		// TestEveryFunctionIsBounded); version 5 models their cost, but
		// for format's (bounds.go).
		ext.Strings(ext.StringsVersion(5)),
	}
	opts = append(opts, partitionFor()...)
	// Ours in place of cel-go's accessors in a time zone (zone.go).
	opts = append(opts, inZoneFunctions()...)
	// Ours, where cel-go has no model or one that is not an upper bound
	// (bounds.go).
	return append(opts, cel.CostModel(models()...))
}

// The one function the connector adds to CEL's: CEL has no hash, and
// placing an event where Kafka places another key (Debezium's
// PartitionRouting SMT, a payload field's hash modulo the partition
// count) needs Kafka's own.

// partitionFor is partitionFor(key, n): the partition of n that Kafka's
// default partitioner (the Java client's, and franz-go's) gives key: the
// positive part of key's murmur2 hash, modulo n. Its cost is
// partitionForCost.
func partitionFor() []cel.EnvOption {
	return []cel.EnvOption{
		cel.Function("partitionFor",
			cel.Overload("partition_for_string_int", []*cel.Type{cel.StringType, cel.IntType}, cel.IntType,
				cel.BinaryBinding(func(key, n ref.Val) ref.Val {
					k, ok1 := key.(types.String)
					parts, ok2 := n.(types.Int)
					switch {
					case !ok1 || !ok2:
						return types.MaybeNoSuchOverloadErr(key)
					case parts < 1:
						return types.NewErr("partitionFor: %d partitions; a topic has at least 1", parts)
					}
					return types.Int(int64(murmur2([]byte(k))&0x7fffffff) % int64(parts))
				}))),
	}
}

// partitionForCost is partitionFor's cost, one of models: a scan of the
// key, as a string function's; the result is an int.
var partitionForCost = cost.Overload("partition_for_string_int",
	cost.EvalCost(cost.Sum(cost.Const(cost.CallCost), cost.StringScan(cost.Arg(0)))),
	cost.ResultSize(cost.Const(1)))

// murmur2 is Kafka's murmur2 hash of b (org.apache.kafka.common.utils
// .Utils.murmur2), seed 0x9747b28c.
func murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		b = b[4:]
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

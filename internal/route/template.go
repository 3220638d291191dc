package route

import (
	"fmt"
	"strings"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// expand fills a template (parsed by outbox.Table.Validate) from ev. A NULL
// value used by the template is an error.
func expand(tp outbox.Template, ev *outbox.Event) (string, error) {
	if len(tp.Parts) == 1 && tp.Parts[0].Kind == outbox.PartLiteral {
		return tp.Parts[0].Text, nil
	}
	var b strings.Builder
	for _, p := range tp.Parts {
		var v outbox.Value
		switch p.Kind {
		case outbox.PartLiteral:
			b.WriteString(p.Text)
			continue
		case outbox.PartSchema:
			b.WriteString(ev.Table.Name.Schema)
			continue
		case outbox.PartTable:
			b.WriteString(ev.Table.Name.Name)
			continue
		case outbox.PartPrefix:
			b.WriteString(ev.Table.MessagePrefix)
			continue
		case outbox.PartField:
			v = ev.Fields[p.Field]
		case outbox.PartColumn:
			v = ev.Extra[p.Extra]
		}
		if v.Null() {
			return "", fmt.Errorf("{%s} is NULL", p.Name)
		}
		b.Write(v.B)
	}
	return b.String(), nil
}

package main

import (
	"fmt"
	"github.com/stubbornhq/stubborn/delegates"
)

func main() {
	for _, s := range []string{
		"delegates:\n  - name: a\n    target: x:1\n  - name: b\n    target: x:2\n    tmeout: 5s\n    timeout: 5 s\n",
		"delegates:\n  - name: a\n    target: x:1\n    idempotent: maybe\n",
		"delegates: [\n",
		"delegates:\n  - name: a\n  - name: a\n    target: x:1\n",
		"delegates:\n  - name: a\n    name: b\n",
	} {
		_, err := delegates.Parse([]byte(s))
		fmt.Printf("%v\n---\n", err)
	}
}

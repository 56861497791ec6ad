package server_test

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// apiSeed is one input of FuzzAPI.
type apiSeed struct {
	sel                         uint8
	raw                         []byte
	id, brief, names, meta, cel string
	n                           int64
}

// apiSel is the selector of rpc with variant, sending fields or raw bytes.
func apiSel(rpc string, variant int, raw bool) uint8 {
	for i, r := range apiRPCs {
		if r.name == rpc {
			sel := uint8(i + len(apiRPCs)*variant)
			if sel > 0x7f {
				panic(fmt.Sprintf("variant %d of %s is too large", variant, rpc))
			}
			if raw {
				sel |= 0x80
			}
			return sel
		}
	}
	panic("no RPC " + rpc)
}

// apiSeeds are issue 17's findings, an empty message for each RPC, and
// normal requests that make runs of every kind for the others to act on.
func apiSeeds() []apiSeed {
	var seeds []apiSeed
	add := func(s apiSeed) { seeds = append(seeds, s) }

	// Normal runs first, for the odd variants of the RPCs that take a
	// run_id to act on: variant 2i+1 names the i-th newest.
	add(apiSeed{sel: apiSel("StartRun", 0, false), brief: "find it", names: "echo"})
	add(apiSeed{sel: apiSel("Run", 0, false), brief: "find it", names: "flaky,echo", meta: "team=search\ntrace=1"})
	add(apiSeed{sel: apiSel("StartRun", 1, false), brief: "race", names: "echo,flaky", cel: `size(result.text) > 3`})
	add(apiSeed{sel: apiSel("Run", 3, false), brief: "learn", names: "flaky,echo", cel: `result.text == ""`, n: 3})
	// options: a judge (the last name) and timeouts.
	add(apiSeed{sel: apiSel("StartRun", 8, false), brief: "judged", names: "echo,echo", id: "key-1", n: 5000 | 2000<<16})
	// retry of down, no retry: awaiting a decision (ASK is the default).
	add(apiSeed{sel: apiSel("StartRun", 2, false), brief: "ask me", names: "down"})
	// retry of down, 3 retries after waits of up to 999 ms: backing off.
	add(apiSeed{sel: apiSel("StartRun", 2, false), brief: "wait", names: "down", n: 3 + 999<<4})
	add(apiSeed{sel: apiSel("GetRun", 1, false)})
	add(apiSeed{sel: apiSel("WatchRun", 3, false)})               // awaiting a decision: hung up on
	add(apiSeed{sel: apiSel("WatchRun", 9, false), n: 2 | 1<<32}) // from seq 2, in batches of 1
	add(apiSeed{sel: apiSel("DecideRun", 3, false), n: int64(stubbornv1.Decision_DECISION_RETRY)})
	add(apiSeed{sel: apiSel("DecideRun", 3, false), n: int64(stubbornv1.Decision_DECISION_FAIL)})
	add(apiSeed{sel: apiSel("DecideRun", 1, false), n: 7})
	add(apiSeed{sel: apiSel("CancelRun", 1, false)})
	add(apiSeed{sel: apiSel("ListRuns", 0, false), n: int64(stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED) | 2<<32})
	add(apiSeed{sel: apiSel("ListRuns", 1, false), n: 2 << 32})

	// An empty message for each RPC.
	for _, r := range apiRPCs {
		add(apiSeed{sel: apiSel(r.name, 0, true), raw: []byte{}})
	}

	// Finding 1: a run_id of 4,000 letters closed the store's connection.
	long := strings.Repeat("a", 4000)
	for _, rpc := range []string{"GetRun", "CancelRun", "DecideRun", "WatchRun"} {
		add(apiSeed{sel: apiSel(rpc, 0, false), id: long, n: 1})
	}
	add(apiSeed{sel: apiSel("ListRuns", 0, false), id: long})

	// Finding 6: a chain of 60 empty names made a status too large for
	// C-core clients; a brief with invalid UTF-8 was INTERNAL.
	add(apiSeed{sel: apiSel("StartRun", 0, false), names: strings.Repeat(",", 59)})
	add(apiSeed{sel: apiSel("Run", 1, false), names: strings.Repeat(",", 59), id: strings.Repeat("\n", 300)})
	add(apiSeed{sel: apiSel("StartRun", 0, false), brief: "brief \xff\xfe\xc3\x28\x80", names: "echo"})
	add(apiSeed{sel: apiSel("Run", 0, false), brief: "x", names: "echo,\xff", meta: "k\xc3=v\nok=\x80"})
	truncated, err := proto.Marshal(&stubbornv1.StartRunRequest{TaskBrief: "a brief", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	if err != nil {
		panic(err)
	}
	truncated = truncated[:len(truncated)-3]
	add(apiSeed{sel: apiSel("StartRun", 0, true), raw: truncated})
	add(apiSeed{sel: apiSel("Run", 0, true), raw: truncated})

	// Finding 2: an amplifying CEL expression over a large answer
	// exhausted memory, then crash-looped the server.
	amplify := `result.text.replace("", result.text + result.text).size() < 0`
	add(apiSeed{sel: apiSel("StartRun", 0, false), brief: strings.Repeat("x", 20<<10), names: "echo", cel: amplify})
	add(apiSeed{sel: apiSel("Run", 3, false), brief: strings.Repeat("y", 20<<10), names: "echo", cel: amplify, n: 2})

	// Issue 30: a delegate's answer 3,400 objects deep (an http
	// delegate's body, a model's usage) made every listing INTERNAL.
	deep := strings.Repeat(`{"a":`, 3400) + "1" + strings.Repeat("}", 3400)
	add(apiSeed{sel: apiSel("StartRun", 0, false), brief: deep, names: "answer"})
	add(apiSeed{sel: apiSel("Run", 0, false), brief: deep, names: "model"})
	add(apiSeed{sel: apiSel("StartRun", 1, false), brief: strings.Repeat("[", 30000) + strings.Repeat("]", 30000), names: "answer,model"})
	add(apiSeed{sel: apiSel("Run", 0, false), brief: `{"a":[1,{"b":null}],"c":"d"}`, names: "answer", cel: `result.data.c == "d"`})

	// A huge metadata map.
	var md strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&md, "key-%04d=%s\n", i, strings.Repeat("v", 100))
	}
	add(apiSeed{sel: apiSel("StartRun", 0, false), brief: "metadata", names: "echo", meta: strings.TrimSuffix(md.String(), "\n")})
	return seeds
}

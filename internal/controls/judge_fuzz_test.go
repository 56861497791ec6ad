package controls

import (
	"strings"
	"testing"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// FuzzJudgeAnswer reads any answer a judge delegate may give, for each
// wording: never a panic; an unread answer says nothing (false, no reason);
// a read one contains the wording's field. The judge's brief is built from
// any criteria and result, and quotes the criteria whole.
func FuzzJudgeAnswer(f *testing.F) {
	for _, a := range []string{
		`{"is_failure": true, "reason": "too short"}`,
		`{"is_failure": false}`,
		`Sure! {"is_failure": "TRUE", "reason": "x"} hope that helps`,
		`{"is_acceptable": true, "reason": "fine"}`,
		`{"is_acceptable": "false", "reason": {"nested": 1}}`,
		`{"is_failure": null}`,
		`{"is_failure": 1}`,
		`{ "is_failure": true } and { "other": 1 }`,
		`no json here`,
		`{"is_failure": tru`,
		`{"is_failure"}`,
		"{\"is_failure\": \"\xff\xfe\"}",
		`{"reason": "r", "is_failure": "  False  "}`,
	} {
		f.Add(a, "the answer must cite a source")
	}
	f.Fuzz(func(t *testing.T, answer, criteria string) {
		for _, w := range []wording{wordingRetryWithLearning, wordingFallbackChain, wordingRace} {
			value, reason, ok := readJudgeAnswer(w, answer)
			if !ok && (value || reason != "") {
				t.Fatalf("unread answer %q gave %v, %q", answer, value, reason)
			}
			if ok && !strings.Contains(answer, `"`+w.field()+`"`) {
				t.Fatalf("answer %q read without %q", answer, w.field())
			}
			brief := judgeBrief(w, criteria, &stubbornv1.Result{Text: answer})
			if !strings.Contains(brief, `"`+criteria+`"`) {
				t.Fatalf("brief does not quote the criteria %q", criteria)
			}
		}
	})
}

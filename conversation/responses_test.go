package conversation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/conversation"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func TestResponsesTextInputAndAnswer(t *testing.T) {
	t.Parallel()
	req := decode(t, conversation.Responses{}, `{"model":"smart","input":"Hi","instructions":"Be brief."}`)
	assert.Equal(t, "smart", req.Model)
	msgs := req.Conversation.GetMessages()
	require.Len(t, msgs, 2)
	assert.Equal(t, stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, msgs[0].GetRole())
	assert.Equal(t, "Hi", conversation.Text(msgs[1]))
	out, err := conversation.Responses{}.EncodeResponse(&stubbornv1.Result{Text: "Hello"}, conversation.Meta{ID: "r1", Model: "smart", Created: 5, Conversation: req.Conversation})
	require.NoError(t, err)
	assert.Contains(t, string(out), `"output_text","text":"Hello"`)
}

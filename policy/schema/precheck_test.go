package schema

import "testing"

func TestSecretLike(t *testing.T) {
	secrets := []string{"sk-proj-abc", "ghp_abcdef", "AKIAIOSFODNN7EXAMPLE", "Bearer x", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.sig",
		"https://u:p@host/x", "https://host/v1?api_key=1", "QWxhZGRpbjpvcGVuIHNlc2FtZQ9876543210zZ"}
	for _, s := range secrets {
		if secretLike("", s) == "" {
			t.Errorf("%q not recognised as a secret", s)
		}
	}
	plain := []string{"Meta-Llama-3.1-70B-Instruct-Turbo", "claude-sonnet-4-5-20250929", "/srv/paseo/workspace/proj", "alice/fake-llm",
		"https://llm.example.test:8443/v1", "wks_4be1", "agent-7f3c"}
	for _, s := range plain {
		if why := secretLike("", s); why != "" {
			t.Errorf("%q taken for a secret (%s)", s, why)
		}
	}
}

package rrl

import (
	"strings"
	"testing"
)

func TestStringers(t *testing.T) {
	tests := []struct{ got, want string }{
		{AllowanceNXDomain.String(), "AllowanceNXDomain"},
		{AllowanceCategory(9).String(), "AllowanceCategory(9)"},
		{Slip.String(), "Slip"},
		{Action(-1).String(), "Action(-1)"},
		{IPRateLimit.String(), "IPRateLimit"},
		{IPAllRateLimit.String(), "IPAllRateLimit"},
		{RTNotUDP.String(), "RTNotUDP"},
		{RTReason(42).String(), "RTReason(42)"},
		{(&ResponseTuple{Class: 1, Type: 28, AllowanceCategory: AllowanceAnswer, SalientName: "a.example."}).String(), "1/28 AllowanceAnswer sn=a.example."},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
	cfg := NewConfig()
	cfg.SetValue("responses-per-second", "7")
	if s := cfg.String(); !strings.Contains(s, `responses-per-second="7"`) || !strings.Contains(s, `window="15"`) {
		t.Errorf("Config.String() = %s", s)
	}
}

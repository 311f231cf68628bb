package idempotency

import (
	"encoding/hex"
	"testing"
)

// fingerprintGoldens are fingerprints computed by the code of
// 2026-12-01, before the body was decoded once for the validator and the
// fingerprint alike. A stored key keeps its fingerprint across an upgrade:
// if any of these changes, a retry sent across a deploy would be answered
// 422 (the key reused for another request) instead of its replay. So a
// failure here is never fixed by updating the table; the canonical form
// must be put back.
//
// The bodies cover what a canonical form can get wrong: member order and
// whitespace, nesting, numbers' literal text, escapes that encoding/json
// rewrites (\u00e9, \/, \u003c) or keeps escaped (U+2028, U+2029, control
// characters), HTML characters left unescaped, and the empty body. (A body
// with invalid UTF-8 or a lone surrogate had one here until 2026-12-03,
// read as U+FFFD; such bodies are refused since, with a 400, before any
// key is claimed: a retry of one is refused too, never replayed wrong.)
var fingerprintGoldens = []struct{ method, path, body, hex string }{
	{"POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":"Two espressos"}`, "30a53982d1d5b032f09f295a0fc8ec6664a416e59cc54e8d66d3796b2a347cde"},
	{"POST", "/v1/orders", "{\n \"description\": \"Two espressos\", \"currency\":\"usd\",\t\"amount\" : 1999}\n", "30a53982d1d5b032f09f295a0fc8ec6664a416e59cc54e8d66d3796b2a347cde"},
	{"POST", "/v1/orders/ord_123/charges", `{"payment_method":"pm_card_visa"}`, "76093a01c4e76bd42c784a7cf86ffee7f4c01d7dcb2177442da326209087d73d"},
	{"POST", "/v1/charges/ch_1/refunds", `{"amount":500,"reason":"requested_by_customer"}`, "c3214fa90c634d524679f2faa098f6d19e880473b999d761194aeac010507115"},
	{"POST", "/v1/payouts", `{"amount":10000,"currency":"usd"}`, "4d6d5da833a27df0995979096e054e7aab6cb306ac25b199fdb22fbe9f0c302e"},
	{"POST", "/v1/orders", ``, "aeff4b94204e531946c9046d2a26c7a2486db521ed163f6dd4fb46b622a0dd2c"},
	{"POST", "/v1/orders", "  \n", "aeff4b94204e531946c9046d2a26c7a2486db521ed163f6dd4fb46b622a0dd2c"},
	{"POST", "/v1/x", `{}`, "83896ced0ce0bdc38bff9232c869e93b56210e4706982bd0d687a2630bd36ab0"},
	{"POST", "/v1/x", `[]`, "e49af47b2909becb877b06ea890981422bde602bac93544cf80ae4d3d8aebb46"},
	{"POST", "/v1/x", `null`, "85c098645a711de585eb0790e426e6f906eb6a8aa8b3a74394e654fb67ac6055"},
	{"POST", "/v1/x", `{"a":{"y":[1,{"q":2,"p":1}],"x":true},"b":false,"c":null}`, "cb020fe26015ab779369284ae86593ced98f6d256b920e03a70264f798676a57"},
	{"POST", "/v1/x", `{"n":[0,-0,1.50,2e3,1E+2,-12.5e-3,12345678901234567890123]}`, "538b6c371c5d8d18b07dded68a8ad48b4f4d2bb1724eab6d28adeb2771f74d79"},
	{"POST", "/v1/x", `{"s":"<&> \u00e9 \/ \u003c \"q\" \\ \n\t\u0001 \u2028\u2029 é 😀 \ud83d\ude00"}`, "bfa726b9132b80b780dc9522b141aea444e9b634c39e835dcfc9ecac8ea0a764"},
	{"POST", "/v1/x", `{"\u0062":1,"a":2}`, "21b6a9c87acea5323a1639053bbed6e219cc555e1d73c35f5278823a8305bb4b"},
	{"PUT", "/v1/x", `"just a string"`, "1e84a10443554c274a619af1cfd76e7d2125ea0f7f1517b86f99f531dc1a82f5"},
}

func TestFingerprintsDoNotChangeAcrossVersions(t *testing.T) {
	t.Parallel()
	for _, g := range fingerprintGoldens {
		fp, err := fingerprintBody(g.method, g.path, []byte(g.body))
		if err != nil {
			t.Errorf("%s %s %q: %v", g.method, g.path, g.body, err)
			continue
		}
		if got := hex.EncodeToString(fp); got != g.hex {
			t.Errorf("%s %s %q: fingerprint %s, stored keys hold %s", g.method, g.path, g.body, got, g.hex)
		}
	}
}

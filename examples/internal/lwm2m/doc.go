// Package lwm2m is an LwM2M-shaped registration server and device for the
// fleet simulator (examples/fleet): CoAP (github.com/plgd-dev/go-coap/v3)
// over DTLS 1.2 with connection IDs (pion/dtls v3), the server behind
// cidroute proxies on the PPv2 adapter (dtls/piondtls).
//
// It implements what a fleet's traffic is made of, not LwM2M: the
// registration interface (POST /rd?ep=…&lt=…&b=U with a link-format
// payload → 2.01 and Location-Path /rd/<id>; POST /rd/<id> → 2.04, 4.04
// when unknown; DELETE; lifetime expiry), and one observation per
// registration, which the device answers with confirmable notifications.
// No objects, no bootstrap, no SenML.
package lwm2m

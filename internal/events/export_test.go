package events

// PublicOnly is the relay's connect-time guard, for the tests.
var PublicOnly = publicOnly

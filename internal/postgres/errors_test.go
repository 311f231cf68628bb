package postgres

import (
	"errors"
	"testing"
)

var errBase = errors.New("conn closed")

func TestWrap(t *testing.T) {
	t.Parallel()
	f := func(fail bool) (err error) {
		defer Wrap(&err, "orders.Get(%q)", "ord_1")
		if fail {
			return errBase
		}
		return nil
	}
	if err := f(false); err != nil {
		t.Errorf("a success became %v", err)
	}
	err := f(true)
	if err == nil || err.Error() != `orders.Get("ord_1"): conn closed` || !errors.Is(err, errBase) {
		t.Errorf("got %v; want the operation's name in front, and the cause still found by errors.Is", err)
	}
}

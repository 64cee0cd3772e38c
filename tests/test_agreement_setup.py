"""The agreement log's ring size is fixed in one store request, and the store's ``set`` with
``if_absent`` keeps the first value (backends/rendezvous.py, backends/agreement.py)."""
from __future__ import annotations

import pytest


def test_set_if_absent_keeps_the_first_value():
    from hcc.backends.rendezvous import RendezvousError, StoreClient, StoreServer

    with StoreServer("tok") as srv:
        a, b = StoreClient(srv.address, "tok", 5), StoreClient(srv.address, "tok", 5)
        try:
            assert a.set_default("k", 7) == 7
            assert b.set_default("k", 9) == 7 and b.peek("k") == 7
            with pytest.raises(RendezvousError, match="if_absent"):
                a._call({"op": "set", "key": "k", "value": 1, "if_absent": "yes"})
            assert b.peek("k") == 7
        finally:
            a.close()
            b.close()


def test_capacity_is_one_store_request_and_all_agree():
    from hcc.backends.agreement import EventLog, capacity
    from hcc.backends.rendezvous import StoreServer

    with StoreServer("tok") as srv:
        first = EventLog(srv.address, "tok", "g", timeout=5, world=3)
        driver = EventLog(srv.address, "tok", "g", timeout=5)  # no world: the Ray driver's log
        try:
            for log in (first, driver):
                calls = []
                inner = log.client._call_full
                log.client._call_full = lambda req, wait=0.0, inner=inner: calls.append(req) or inner(req, wait)
                assert log.capacity == capacity(3)
                assert log.capacity == capacity(3)  # cached: no second request
                assert len(calls) == 1, calls
        finally:
            first.close()
            driver.close()

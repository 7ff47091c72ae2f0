"""The integration tests' check for API refusals in the sidecar's log reads fields, not digits anywhere.

CI once failed because a record's timestamp (``17:36:17.403``) contained "403"."""

from tests.integration.sidecar_helpers import refusals


def test_a_timestamp_or_uid_with_403_in_it_is_not_a_refusal():
    assert refusals([{"ts": "2026-12-03T17:36:17.403+00:00", "event": "decision", "uid": "a403f-403b", "n": 403}]) == []


def test_each_way_the_sidecar_reports_a_refusal_is_found():
    found = [{"event": "error", "error": "patch rc: forbidden (403): no"}, {"event": "x", "status": 403},
             {"event": "y", "detail": {"message": "ValidatingAdmissionPolicy denied request"}},
             {"event": "z", "errors": ["scale: (403)"]}]
    assert refusals(found + [{"event": "ok"}]) == found
